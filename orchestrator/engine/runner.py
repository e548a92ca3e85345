"""The playbook engine: runs plays over inventory hosts in serial batches.

Within a batch, up to ``forks`` hosts run in parallel; each host runs the play's steps
in order (a failed task ends that host's play after its block's ``rescue`` and
``always`` steps). After each batch, the failed share is compared with
``max_fail_percentage`` (Ansible's rule: it must be exceeded) and the play stops
there if needed; hosts never started are reported as such.

Where orch differs from Ansible on purpose (the README lists these too):

- every ``rescue`` and ``always`` step runs even after one of them fails (the first failure is
  reported after the last step): a failed restore must not keep the unit from being started;
  Ansible stops a rescue at its first failure;
- the hosts of a batch run the play independently, each in its own thread, like Ansible's
  ``free`` strategy (not its default ``linear``): a host never waits for another's task;
- a batch whose failed share exceeds ``max_fail_percentage`` (default: any failure) stops the
  play; Ansible's default lets every batch run.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Callable, Mapping

from .. import templating
from ..connection import CommandTimeout, ConnectError, HostUnreachable
from ..connection.deadline import task_deadline
from ..connection.reconnect import is_transient
from ..errors import internal_error
from ..facts.catalog import HostFacts
from ..facts.schema import FactError
from ..inventory.variables import var
from .batching import batch_failed, order_hosts, server_batches, servers_in
from .context import HostContext, RunOptions
from .playbook import Block, Play, Step, Task
from .results import (CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, Cancelled, HostRecap, TaskFailed,
                      TaskResult)
from .task import SKIP, TaskArgError, TaskSpec


@internal_error("ends a host's play inside Engine; caught there and recorded as the host's outcome")
class _HostDone(Exception):
    """Internal: the host's play ended (failed or unreachable); carries the status and cause."""

    def __init__(self, status: str, cause: str):
        super().__init__(cause)
        self.status = status
        self.cause = cause


def _hook(hooks: list, method: str, *args: Any) -> None:
    for h in hooks:
        fn = getattr(h, method, None)
        if fn is not None:
            fn(*args)


class Engine:
    """Runs plays. ``tasks`` maps a task name to its :class:`TaskSpec` (``@task`` declarations).

    ``reporter`` receives ``task_result(host, task_name, result)``, ``progress(host, **f)``
    and ``line(text)`` calls (see :mod:`orchestrator.ui`); ``emit(event, **fields)``
    records events (see :mod:`orchestrator.records`, which drops secrets before writing).
    """

    def __init__(self, tasks: dict[str, TaskSpec], options: RunOptions, reporter, emit: Callable[..., None]):
        self.tasks = tasks
        self.options = options
        self.reporter = reporter
        self.emit = emit

    # -- public -----------------------------------------------------------------------
    def run_play(self, play: Play, hosts: list, hostvars: Callable[[Any], dict], *, serial=None,
                 forks: int = 5, max_fail_percentage: float | None = None,
                 any_errors_fatal: bool | None = None, order: str | None = None,
                 servers: Mapping[str, str] | None = None) -> dict[str, HostRecap]:
        """Run ``play`` over ``hosts`` (inventory Host objects, already limited).

        ``servers``: host name -> the multi-node server it is a rank of (hosts absent: single-node).
        ``serial`` and ``max_fail_percentage`` then count servers, not hosts: the ranks of one
        server run in the same batch (:func:`~.batching.server_batches`), and a server fails when
        any of its ranks fails.

        ``hostvars(host)`` returns the merged variables of a host. CLI values
        (``serial``, ``max_fail_percentage``, ``any_errors_fatal``, ``order``) override
        the play's. Returns a recap per host name, in inventory order.
        """
        serial = serial if serial is not None else play.serial
        mfp = max_fail_percentage if max_fail_percentage is not None else play.max_fail_percentage
        fatal = play.any_errors_fatal if any_errors_fatal is None else any_errors_fatal
        ordered = order_hosts(hosts, order or play.order)
        recaps = {h.name: HostRecap(h.name) for h in ordered}
        self.emit("play_start", play=play.name, hosts=[h.name for h in ordered], check=self.options.check)
        servers = dict(servers or {})
        batches = server_batches(ordered, serial, lambda h: servers.get(h.name))
        for bi, batch in enumerate(batches):
            if self.options.cancel.is_set():
                break
            self.emit("batch_start", batch=bi + 1, hosts=[h.name for h in batch])
            _hook(self.options.hooks, "start_batch", [h.name for h in batch])
            with cf.ThreadPoolExecutor(max_workers=max(1, min(forks, len(batch)))) as pool:
                futs = {pool.submit(self._run_host, play, h, hostvars(h), recaps[h.name]): h for h in batch}
                for fut in cf.as_completed(futs):
                    fut.result()
            units = servers_in(batch, lambda h: servers.get(h.name))
            failed = sum(1 for u in units if any(recaps[h.name].is_failure for h in u))
            self.emit("batch_end", batch=bi + 1, failed=failed, size=len(units))
            if failed and (fatal or batch_failed(len(units), failed, mfp)):
                rest = [h.name for b in batches[bi + 1:] for h in b]
                what = "hosts" if len(units) == len(batch) else "servers"
                if rest:
                    self.reporter.line(f"stopping: {failed} of {len(units)} {what} failed in batch {bi + 1}; "
                                       f"not started: {', '.join(rest)}")
                self.emit("play_aborted", batch=bi + 1, not_started=rest)
                break
        self.emit("play_end", play=play.name,
                  recap={n: {"outcome": r.outcome, "cause": r.cause} for n, r in recaps.items()})
        return recaps

    # -- per host ---------------------------------------------------------------------
    def _run_host(self, play: Play, host, variables: dict, recap: HostRecap) -> None:
        variables = dict(variables)
        variables.update(play.vars)
        variables.update(self.options.extra)
        variables.setdefault("inventory_hostname", host.name)
        variables["check_mode"] = self.options.check
        variables["run_id"] = self.options.run_id
        variables["group_names"] = list(getattr(host, "groups", []))
        ctx = HostContext(host.name, variables, self.options, self.emit,
                          progress=self.reporter.progress, echo=self.reporter.line)
        _hook(self.options.hooks, "host_started", host.name)
        recap.outcome = "running"
        try:
            self._steps(play.steps, ctx, recap, protected=False)
            recap.outcome = "check" if self.options.check else "completed"
        except _HostDone as done:
            recap.outcome = done.status
            recap.cause = done.cause
        except Exception as exc:  # an engine bug must not leave other hosts hanging
            recap.outcome = FAILED
            recap.cause = f"internal error: {type(exc).__name__}: {exc}"
            recap.failed += 1
            self.emit("internal_error", host=host.name, error=recap.cause)
        finally:
            # what tasks started for the length of the play (the lock heartbeat thread, check
            # mode's temp folder) ends here
            done, ctx.run.on_done = list(ctx.run.on_done), []
            ctx.protected = True
            for fn in done:
                try:
                    fn(ctx)
                except Exception as exc:  # must not keep the host from finishing
                    self.emit("internal_error", host=host.name, error=f"on_done {getattr(fn, '__name__', fn)}: {exc}")
            _hook(self.options.hooks, "host_done", host.name)
            recap.summary = ctx.run.summary
            ctx.close()

    def _steps(self, steps: list[Step], ctx: HostContext, recap: HostRecap, protected: bool) -> None:
        """Run ``steps`` in order. Protected steps (rescue/always) all run even when one fails,
        so a failed restore cannot keep the unit from being started again; the first failure
        is raised after the last step."""
        first: _HostDone | None = None
        for step in steps:
            try:
                if isinstance(step, Block):
                    self._block(step, ctx, recap, protected)
                else:
                    self._task(step, ctx, recap, protected)
            except _HostDone as done:
                if not protected:
                    raise
                first = first or done
        if first is not None:
            raise first

    def _block(self, block: Block, ctx: HostContext, recap: HostRecap, protected: bool) -> None:
        if not templating.evaluate(block.when, ctx.vars):
            return
        failure: _HostDone | None = None
        try:
            try:
                self._steps(block.block, ctx, recap, protected)
            except _HostDone as done:
                failure = done
                # the ranks of the same multi-node server stop waiting for this host (ServerBarrier)
                _hook(self.options.hooks, "host_failed", ctx.name, done.cause)
                if block.rescue and done.status != "cancelled-before-start":
                    ctx.vars["orch_failure"] = {"status": done.status, "cause": done.cause,
                                                "task": ctx.current_task}
                    recap.rescued += 1
                    self.emit("rescue_start", host=ctx.name, cause=done.cause)
                    try:
                        self._steps(block.rescue, ctx, recap, protected=True)
                    except _HostDone as rescue_fail:
                        # a host lost during its rescue is reported unreachable (`orch recover` later)
                        status = UNREACHABLE if UNREACHABLE in (done.status, rescue_fail.status) else FAILED
                        failure = _HostDone(status, f"{done.cause}; rescue also failed: {rescue_fail.cause}")
        finally:
            if block.always:
                try:
                    self._steps(block.always, ctx, recap, protected=True)
                except _HostDone as always_fail:
                    failure = failure or always_fail
        if failure is not None:
            raise failure

    def _task(self, task: Task, ctx: HostContext, recap: HostRecap, protected: bool) -> None:
        ctx.current_task = task.name
        ctx.protected = protected
        if not protected and ctx.cancelled():
            raise _HostDone(FAILED, "interrupted by the operator")
        spec = self.tasks[task.module]
        clock: list[float] = []  # when the task's function began (empty: it did not run)
        try:
            result = self._call_again_after_lost_link(task, spec, ctx, clock)
        except TaskArgError as exc:
            result = TaskResult(FAILED, f"{task.module}: {exc}")
        except TaskFailed as exc:
            result = TaskResult(FAILED, exc.msg, exc.data)
        except HostUnreachable as exc:
            result = TaskResult(UNREACHABLE, str(exc))
        except CommandTimeout as exc:
            result = TaskResult(FAILED, self._timed_out(task, clock) or str(exc))
        except (ConnectError, templating.TemplateError) as exc:  # CommandFailed, TransferFailed, RouteError
            result = TaskResult(FAILED, str(exc))
        except Cancelled:
            result = TaskResult(FAILED, "interrupted by the operator")
        except Exception as exc:  # a bug in a task must still lead to the block's rescue
            result = TaskResult(FAILED, f"internal error in {task.module}: {type(exc).__name__}: {exc}")
            self.emit("internal_error", host=ctx.name, task=task.name, error=result.msg)
        late = self._timed_out(task, clock)
        if late and result.status not in (FAILED, UNREACHABLE):
            result = TaskResult(FAILED, late, result.data)
        ctx.vars.update(result.facts)
        self._record(ctx, recap, task, result)
        if task.register:
            ctx.vars[task.register] = result.registered()
        if result.status in (FAILED, UNREACHABLE) and not task.ignore_errors:
            raise _HostDone(result.status, f"{task.name}: {result.msg}")

    def _call_again_after_lost_link(self, task: Task, spec: TaskSpec, ctx: HostContext,
                                    clock: list[float]) -> TaskResult:
        """:meth:`_call`, run again after a lost link when the task is declared ``rerun``: the
        engine logs in again (:meth:`orchestrator.connection.base.Connection.reconnect`, bounded
        backoff) until ``orch_reconnect_timeout`` s after the link was lost, then runs the task
        again (``ctx.attempt`` counts). Past that time the host is given up (``ctx.run.link_given_up``):
        the :class:`HostUnreachable` raised says so, and later steps try the host once each."""
        ctx.attempt = 1
        while True:
            try:
                result = self._call(task, spec, ctx, clock)
            except HostUnreachable as exc:
                if not (spec.rerun and is_transient(exc) and ctx.connection is not None
                        and not ctx.run.link_given_up and not ctx.cancelled()):
                    raise
                if ctx.run.link_lost_at is None:
                    ctx.run.link_lost_at = time.monotonic()
                self._reconnect(task, ctx, exc)
                clock.clear()
                ctx.attempt += 1
                continue
            except BaseException:
                ctx.run.link_lost_at = None  # the step ended otherwise: the host had answered again
                raise
            # the step ended: the loss is over (one loss lasts until then, so a link that keeps
            # dropping under the same step gives it orch_reconnect_timeout in all, not each time)
            ctx.run.link_lost_at = None
            return result

    def _reconnect(self, task: Task, ctx: HostContext, exc: HostUnreachable) -> None:
        """Log in to the host again for what is left of ``orch_reconnect_timeout`` since the link was
        lost; raises :class:`HostUnreachable` naming the deadline once it has passed."""
        limit = float(var(ctx.vars, "orch_reconnect_timeout"))
        lost_for = time.monotonic() - ctx.run.link_lost_at
        first = str(exc).splitlines()[0]
        ctx.emit("link_lost", error=first, attempt=ctx.attempt, reconnect_within_s=round(limit - lost_for, 1))
        ctx.say(f"connection lost in '{task.name}' ({first}); reconnecting for up to {max(0, limit - lost_for):.0f} s "
                "(orch_reconnect_timeout), then the step runs again")

        def note(n: int, err: BaseException, wait_s: float) -> None:
            ctx.emit("reconnect_retry", attempt=n, error=str(err).splitlines()[0][:300], wait_s=round(wait_s, 1))

        try:
            tries = ctx.connection.reconnect(max(0.0, limit - lost_for),
                                             cancel=None if ctx.protected else self.options.cancel, on_retry=note)
        except HostUnreachable as last:
            if self.options.cancel.is_set() and not ctx.protected:
                raise Cancelled("interrupted by the operator while reconnecting") from None
            ctx.run.link_given_up = True
            dm = ctx.run.deadman
            after = (f"; the host's dead-man ({dm.get('unit')}) restores the earlier configs and starts the unit "
                     f"once no controller has checked in for {dm.get('deadline_s'):g} s" if dm else "")
            ctx.emit("link_given_up", error=str(last).splitlines()[0][:300], after_s=limit)
            raise HostUnreachable(f"{ctx.name}: unreachable for {limit:g} s (orch_reconnect_timeout) after the "
                                  f"connection was lost in '{task.name}' ({first}); last attempt: "
                                  f"{str(last).splitlines()[0]}{after}") from None
        back = time.monotonic() - ctx.run.link_lost_at
        ctx.emit("reconnected", attempts=tries, after_s=round(back, 1))
        ctx.run.summary.reconnects = [*(ctx.run.summary.reconnects or []),
                                      {"task": task.name, "attempts": tries, "after_s": round(back, 1)}]
        ctx.say(f"reconnected after {back:.0f} s ({tries} attempt(s)); running '{task.name}' again")

    def _call(self, task: Task, spec: TaskSpec, ctx: HostContext, clock: list[float]) -> TaskResult:
        """Evaluate ``when``, apply check mode, render and check the arguments, run the task under
        its ``timeout:`` and check the facts it returns. ``clock`` gets the monotonic time the
        task's function began."""
        if not templating.evaluate(task.when, ctx.vars):
            return TaskResult.skipped("condition false")
        check = self.options.check if task.check_mode is None else task.check_mode
        if check and spec.check_mode == SKIP:
            return TaskResult.skipped("check mode: would run")
        args = spec.coerce(templating.render(task.args, ctx.vars))
        ctx.task_check = task.check_mode
        clock.append(time.monotonic())
        ctx.step_started = time.time()
        try:
            with task_deadline(task.timeout):
                result = spec.fn(ctx, **args)
        finally:
            ctx.task_check = None
        undeclared = sorted(k for k in result.facts if not spec.allows_fact(k))
        if undeclared:
            raise RuntimeError(f"task {spec.name} set undeclared facts {undeclared} (declared: {list(spec.sets)})")
        try:
            HostFacts.check(result.facts)
        except FactError as exc:
            raise RuntimeError(f"task {spec.name}: {exc}") from None
        return result

    @staticmethod
    def _timed_out(task: Task, clock: list[float]) -> str | None:
        """The failure text when ``task`` ran past its ``timeout:`` (s), else None."""
        if task.timeout is None or not clock or time.monotonic() - clock[0] < task.timeout:
            return None
        return f"the task timed out after {task.timeout:g} s (its timeout:)"

    def _record(self, ctx: HostContext, recap: HostRecap, task: Task, result: TaskResult) -> None:
        recap.count(result.status if result.status in (OK, CHANGED, FAILED, SKIPPED, UNREACHABLE) else OK)
        started = ctx.step_started
        self.emit("task", host=ctx.name, task=task.name, module=task.module, status=result.status,
                  msg=result.msg, data=result.data, **({"start": round(started, 3)} if started else {}))
        ctx.step_started = None
        self.reporter.task_result(ctx.name, task.name, result)
