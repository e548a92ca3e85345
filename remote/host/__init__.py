"""Host operations of the payload: run records, config install and restore, the host lock and
the GPU reaper (standard library only; nothing here goes through a shell).

- :mod:`remote.host.fs`: durable atomic writes, sha256, run-record folders;
- commands: :mod:`~remote.host.install`, :mod:`~remote.host.restore`, :mod:`~remote.host.runs`,
  :mod:`~remote.host.lock`, :mod:`~remote.host.reap`.
"""
