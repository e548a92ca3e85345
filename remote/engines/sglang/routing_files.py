"""SGLang's recorded routing formats, which ``orch_tune_routing_file`` may name (issue 30 item 3):
the tuner times candidates with the routing the server ran (``remote.tuning.tuner.routing``).

- the ``--topk-ids-dir`` folder of SGLang's separate tuner (SGLang 0.5.23
  ``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py``): files
  ``topk_ids_layer{L}_idx{i}.pt``, each an int tensor [tokens, top-k] of expert ids, or one such file;
- an expert-distribution dump of SGLang's recorder (``--expert-distribution-recorder-mode``,
  ``/dump_expert_distribution_record``; SGLang 0.5.23 ``srt/eplb/expert_distribution.py``): mode
  ``stat`` writes ``logical_count`` [steps, layers, experts] (steps summed, the layers' shares
  averaged), mode ``per_token`` writes ``records`` with ``topk_ids_of_layer`` [layers, tokens, k]
  (physical ids mapped back through ``last_physical_to_logical_map``).

torch is imported inside the functions (the engine's package imports without it).
"""

from __future__ import annotations

import glob
import os
import re


from ...protocol import internal_error


@internal_error("raised by load_recorded; remote.tuning.tuner.routing.load_recorded turns it into a RoutingError, "
                "which the tune command reports as a PayloadError (bad_input) naming the file")
class RoutingFileError(ValueError):
    """A recorded routing file that cannot be read (the message names the file); the tuner's
    ``remote.tuning.tuner.routing.load_recorded`` turns it into its ``RoutingError``."""


def Recorded(kind: str, source: str, rows=None, shares=None, files: int = 1) -> dict:  # noqa: N802
    """One loaded recording, as the tuner's ``Recorded`` takes it: ``kind`` ``topk_ids`` (``rows``:
    int64 [T, k]) or ``distribution`` (``shares``: float64 [E_routed] summing to 1)."""
    return {"kind": kind, "source": source, "rows": rows, "shares": shares, "files": files}

#: file names of SGLang's separate tuner's ``--topk-ids-dir``: ``topk_ids_layer{L}_idx{i}.pt``
TOPK_IDS_FILE = re.compile(r"^topk_ids_layer(\d+)_idx(\d+)\.pt$")


def _load_pt(path: str):
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, pickled objects weights_only refuses, truncated
        raise RoutingFileError(f"{path}: not a readable torch file of tensors: {type(exc).__name__}: {exc}") from None


def _as_rows(t, path: str):
    import torch
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype.is_floating_point or t.numel() == 0:
        raise RoutingFileError(f"{path}: expected a non-empty integer tensor [tokens, top-k] of expert ids, got "
                           f"{type(t).__name__}{list(t.shape) if isinstance(t, torch.Tensor) else ''}")
    return t.to(torch.int64)


def load_recorded(path: str) -> dict:
    """Read a recorded routing (module docstring: a topk-ids folder or ``.pt`` file, or an
    expert-distribution dump of mode ``stat`` or ``per_token``). Raises :class:`RoutingError`
    naming the file for anything else."""
    import torch
    if os.path.isdir(path):
        found = []
        for f in glob.glob(os.path.join(path, "topk_ids_layer*_idx*.pt")):
            m = TOPK_IDS_FILE.match(os.path.basename(f))
            if m:
                found.append((int(m.group(1)), int(m.group(2)), f))
        if not found:
            raise RoutingFileError(f"{path}: no topk_ids_layer<L>_idx<i>.pt files (SGLang's --topk-ids-dir layout)")
        found.sort()
        mats = [_as_rows(_load_pt(f), f) for _, _, f in found]
        k = {m.shape[1] for m in mats}
        if len(k) != 1:
            raise RoutingFileError(f"{path}: files disagree on top-k ({sorted(k)} columns)")
        # interleave: row i of the result comes from file i % F (every layer contributes)
        T = max(m.shape[0] for m in mats)
        rows = []
        for r in range(T):
            for m in mats:
                if r < m.shape[0]:
                    rows.append(m[r])
        return Recorded("topk_ids", f"{len(mats)} topk_ids files in {path}", rows=torch.stack(rows), files=len(mats))
    if not os.path.isfile(path):
        raise RoutingFileError(f"{path}: no such file or folder")
    obj = _load_pt(path)
    if isinstance(obj, torch.Tensor):
        return Recorded("topk_ids", f"topk_ids tensor {path}", rows=_as_rows(obj, path))
    if isinstance(obj, dict) and "logical_count" in obj:
        c = obj["logical_count"]
        if not isinstance(c, torch.Tensor) or c.dim() not in (2, 3):
            raise RoutingFileError(f"{path}: logical_count must be a tensor [steps, layers, experts] or [layers, experts]")
        c = c.to(torch.float64)
        if c.dim() == 3:
            c = c.sum(dim=0)
        per_layer = c.sum(dim=1, keepdim=True)
        live = per_layer.squeeze(1) > 0
        if not bool(live.any()):
            raise RoutingFileError(f"{path}: logical_count is all zero (nothing recorded)")
        shares = (c[live] / per_layer[live]).mean(dim=0)
        return Recorded("distribution", f"expert-distribution dump (stat) {path}, {int(live.sum())} layers",
                        shares=shares / shares.sum())
    if isinstance(obj, dict) and "records" in obj:
        p2l = obj.get("last_physical_to_logical_map")
        rows = []
        for rec in obj["records"]:
            t = rec.get("topk_ids_of_layer") if isinstance(rec, dict) else None
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                continue
            t = t.to(torch.int64)
            if isinstance(p2l, torch.Tensor):
                m = p2l.to(torch.int64)
                t = torch.where(t >= 0, torch.gather(m.unsqueeze(1).expand(-1, t.shape[1], -1), 2, t.clamp(min=0)), t)
            rows.append(t.reshape(-1, t.shape[-1]))
        if not rows:
            raise RoutingFileError(f"{path}: expert-distribution dump without per-token records (topk_ids_of_layer)")
        r = torch.cat(rows)
        r = r[(r >= 0).all(dim=1)]  # unfilled slots (-1): padding tokens of the capture buffer
        if r.numel() == 0:
            raise RoutingFileError(f"{path}: the per-token records hold no routed token")
        return Recorded("topk_ids", f"expert-distribution dump (per_token) {path}", rows=r)
    raise RoutingFileError(f"{path}: neither a topk_ids tensor nor an expert-distribution dump (stat: logical_count, "
                       f"per_token: records)")
