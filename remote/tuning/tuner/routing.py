"""The routing a tune times its candidates with: which experts each of the M tokens runs.

A fused-MoE config is timed on one ``topk_ids`` [M, k] / ``topk_weights`` [M, k] pair. The kernel's
work depends on it (how many rows each expert gets, hence the padding of every BLOCK_SIZE_M, how
many experts' weights are read), so a tune should time the routing the server runs:

- **The fused shared expert** (:attr:`Routing.shared`): where SGLang fuses the shared expert into
  the routed GEMM (DeepSeek-V3/R1, GLM-4.5, ...; ``MoeShape.shared_fused``), every token runs it.
  SGLang 0.5.23 ``srt/layers/moe/topk.py`` (``biased_grouped_topk_impl``, ``grouped_topk``, the
  flashinfer path of ``biased_grouped_topk_gpu``) selects ``top_k`` routed experts among the
  ``E - shared`` routed ones, then appends one column per fused shared expert holding the id
  ``E - shared`` (the first id after the routed ones: ``F.pad(..., value=num_experts)``, or
  ``torch.randint(num_experts, num_experts + shared)`` on the other paths, which is the same id
  for one shared expert) with the weight ``fused_shared_expert_weight`` (1.0, or
  ``1 / routed_scaling_factor`` when the factor is applied after the MoE); the routed weights are
  renormalised over the routed columns only. So the kernel runs top-(k + 1) over E experts
  (``E`` already counts the shared one: ``w1.shape[0]``). ``shared_weight`` is that weight
  (1.0 by default: it scales an output row, the kernel's work does not depend on it).
- **A recorded routing** (:attr:`Routing.file`), when the operator gives one:

  * the ``--topk-ids-dir`` folder of SGLang's separate tuner
    (``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton_sep.py``): files
    ``topk_ids_layer{L}_idx{i}.pt``, each a ``torch.save`` of one MoE layer's ``topk_ids``
    (int32 [tokens, k], the shared column included where it is fused; the script's README
    saves them from ``DeepseekV2MoE.forward_normal`` on TP rank 0 for prefills of 4096 tokens
    and more); or one such ``.pt`` file;
  * an expert-distribution dump of SGLang's recorder (``--expert-distribution-recorder-mode``,
    ``/dump_expert_distribution_record``; SGLang 0.5.23 ``srt/eplb/expert_distribution.py``):
    mode ``stat`` writes ``{"rank", "logical_count": int [steps, layers, logical experts], ...}``
    (:func:`load_recorded` sums steps, averages the layers' shares); mode ``per_token`` writes
    ``{"records": [{"topk_ids_of_layer": int [layers, tokens, k] physical ids, ...}],
    "last_physical_to_logical_map": int [layers, physical]}`` (mapped back to logical ids).

  Recorded top-k rows are used as recorded: row ``i`` of the M comes from file ``i mod F``
  (files in (layer, idx) order), row ``i div F`` of it, cycling when the files hold fewer
  tokens, so every MoE layer's routing contributes. A recorded distribution (per-expert
  shares) is sampled: each token draws top-k distinct experts with probabilities
  proportional to the shares (Gumbel top-k), so expert loads follow the recording.
- **Skew** (:attr:`Routing.skew`, what-if): ``s >= 0``; without a recording, expert ``e``'s
  share is proportional to ``rank(e) ** -s`` (Zipf, the ranks a seeded permutation), so
  ``s = 0`` is the uniform routing of random router logits; with a recording, the recorded
  shares are raised to ``1 + s`` (recorded top-k rows become their per-expert counts first).

Without a recording, skew and shared expert, :func:`make` is :func:`remote.tuning.kernel.reference.route`
on random logits, the routing every tune used before (so the same seed gives the same inputs).

Pure Python at import (the tune command imports it without torch); torch is imported by the
functions that build tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...protocol import internal_error

@internal_error("raised while a routing is read or built; remote.tuning.command.tune_routing turns it into a "
                "PayloadError (bad_input) naming the file before the tune starts")
class RoutingError(ValueError):
    """A routing that cannot be built: an unreadable or malformed recording (the message names
    the file), or a recording whose experts or top-k do not match the tuned shape."""


@dataclass(frozen=True)
class Routing:
    """The routing of a tune (the tuner spec's ``routing`` entry is :meth:`to_dict`).

    ``shared``: fused shared experts appended to every row (0, or 1 where SGLang fuses the
    shared expert; ``MoeShape.shared_fused``). ``file``: a recorded routing on this host (module
    docstring: a topk-ids folder or file, or an expert-distribution dump), or None.
    ``skew``: the what-if skew ``s >= 0`` (module docstring). ``shared_weight``: the shared
    column's weight. Raises :class:`RoutingError` for a negative skew or shared count.
    """

    shared: int = 0
    file: str | None = None
    skew: float = 0.0
    shared_weight: float = 1.0
    #: whose recording format ``file`` is in (the unit's engine; None: the default engine's)
    engine: str | None = None

    def __post_init__(self):
        if int(self.shared) < 0:
            raise RoutingError(f"shared experts must be >= 0, got {self.shared}")
        if not float(self.skew) >= 0.0:
            raise RoutingError(f"routing skew must be a number >= 0, got {self.skew!r}")

    @property
    def synthetic(self) -> bool:
        """No recording, no skew, no shared expert: the router-logits routing of every earlier tune."""
        return self.file is None and not self.skew and not self.shared

    def to_dict(self) -> dict:
        """A JSON-able dict (the spec's ``routing`` entry and the checkpoint key's); ``engine`` only
        when set (a routing without a file reads none)."""
        d = asdict(self)
        if d["engine"] is None:
            del d["engine"]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "Routing":
        """Inverse of :meth:`to_dict`; None gives the default (synthetic) routing."""
        if not d:
            return cls()
        return cls(shared=int(d.get("shared") or 0), file=d.get("file") or None, skew=float(d.get("skew") or 0.0),
                   shared_weight=float(d.get("shared_weight", 1.0)), engine=d.get("engine") or None)

    def describe(self) -> str:
        """One line for logs and reports, e.g. ``recorded top-k ids (dir) + fused shared expert, skew 0.5``."""
        base = f"recorded ({self.file})" if self.file else "random router logits"
        if self.skew:
            base += f", skew {self.skew:g}"
        if self.shared:
            base += f" + {self.shared} fused shared expert{'s' if self.shared > 1 else ''} in every row"
        return base


@dataclass
class Recorded:
    """A loaded recording: ``rows`` (int64 [T, k] top-k ids, the routed columns first) or
    ``shares`` (float64 [E_routed] per-expert shares summing to 1); ``source`` says what was read."""

    kind: str  # "topk_ids" or "distribution"
    source: str
    rows: object = None
    shares: object = None
    files: int = 1


def load_recorded(path: str, engine: str | None = None) -> Recorded:
    """Read a recorded routing in the format of the unit's engine (``Engine.load_recorded_routing``;
    ``engine``: its name, None: the default engine's; SGLang's: a topk-ids folder or ``.pt`` file,
    or an expert-distribution dump of mode ``stat`` or ``per_token``, module docstring). Raises
    :class:`RoutingError` naming the file for anything else."""
    from ...engines import engine_named

    try:
        got = engine_named(engine).load_recorded_routing(path)
    except ValueError as exc:  # the engine's own reader names the file
        raise RoutingError(str(exc)) from None
    return got if isinstance(got, Recorded) else Recorded(**got)


def _zipf_shares(E: int, s: float, gen):
    import torch
    ranks = torch.randperm(E, generator=gen).to(torch.float64) + 1.0
    w = ranks ** (-float(s))
    return w / w.sum()


def _sample(shares, M: int, k: int, gen, device):
    """Gumbel top-k: ``k`` distinct experts per token, drawn without replacement with
    probabilities proportional to ``shares``; weights: softmax of the perturbed logits, renormalised."""
    import torch

    from ..kernel.reference import route
    E = shares.numel()
    if k > int((shares > 0).sum()):
        raise RoutingError(f"top-k {k} > the {int((shares > 0).sum())} experts the routing ever uses")
    logp = torch.log(shares.clamp(min=1e-300)).to(torch.float32)
    u = torch.rand(M, E, generator=gen).clamp(min=1e-12, max=1 - 1e-7)
    logits = logp.unsqueeze(0) - torch.log(-torch.log(u))
    logits = torch.where(shares.unsqueeze(0) > 0, logits, torch.full_like(logits, float("-inf")))
    w, ids = route(M, E, k, logits=logits)
    return w.to(device), ids.to(device)


def make(routing: Routing, M: int, E: int, top_k: int, seed: int, device, recorded: Recorded | None = None,
         logits=None) -> tuple:
    """``(topk_weights float32 [M, k], topk_ids int32 [M, k], info)`` on ``device`` for ``M`` tokens.

    ``E``: the kernel's experts (``w1.shape[0]``, fused shared ones included); ``top_k``: routed
    experts per token (``num_experts_per_tok``); ``k = top_k + routing.shared``. ``recorded``: the
    loaded :attr:`Routing.file` (:func:`load_recorded`; loaded here when None and a file is set).
    ``logits``: the router logits [M, E - shared] of the synthetic routing (default: drawn from
    ``seed``). ``info`` is what the report says of the routing timed: ``kind`` (``synthetic``,
    ``recorded top-k ids``, ``recorded distribution``), ``describe``, ``shared_expert``, ``top_k``
    (the kernel's), ``experts``, ``skew``, ``file``, and the load: ``active_experts``,
    ``max_load`` / ``mean_load`` (rows per active expert). Raises :class:`RoutingError`.
    """
    import torch

    from ..kernel.reference import route
    shared = int(routing.shared)
    Er = E - shared
    if Er < top_k or top_k < 1:
        raise RoutingError(f"{E} experts ({shared} shared) cannot give top-{top_k} routed experts")
    gen = torch.Generator()
    gen.manual_seed(int(seed))
    kind = "synthetic"
    if routing.file is not None:
        rec = recorded if recorded is not None else load_recorded(routing.file, routing.engine)
        if rec.kind == "topk_ids" and not routing.skew:
            kind = "recorded top-k ids"
            rows = rec.rows
            kc = rows.shape[1]
            if kc == top_k + shared and shared:
                tail = rows[:, top_k:]
                if not bool(((tail >= Er) & (tail < E)).all()):
                    raise RoutingError(f"{routing.file}: the last {shared} column(s) should hold the fused shared "
                                       f"expert id(s) {Er}..{E - 1}")
                rows = rows[:, :top_k]
            elif kc != top_k:
                raise RoutingError(f"{routing.file}: {kc} columns, the tuned shape runs top-{top_k} routed experts"
                                   + (f" (+{shared} shared: {top_k + shared} columns)" if shared else ""))
            if int(rows.min()) < 0 or int(rows.max()) >= Er:
                raise RoutingError(f"{routing.file}: expert ids {int(rows.min())}..{int(rows.max())} outside the "
                                   f"{Er} routed experts of the tuned shape (expert parallelism: record per rank)")
            idx = torch.arange(M) % rows.shape[0]
            ids = rows[idx]
            # the recording holds no weights: random ones (they scale output rows, not the kernel's work)
            raw = torch.rand(M, top_k, generator=gen) + 0.05
            w = (raw / raw.sum(dim=1, keepdim=True)).to(torch.float32)
            w, ids = w.to(device), ids.to(torch.int32).to(device)
        else:
            kind = "recorded distribution"
            if rec.kind == "topk_ids":
                rows = rec.rows[:, :top_k]
                rows = rows[(rows >= 0).all(dim=1) & (rows < Er).all(dim=1)]
                if rows.numel() == 0:
                    raise RoutingError(f"{routing.file}: no row routes within the {Er} routed experts")
                shares = torch.bincount(rows.reshape(-1), minlength=Er).to(torch.float64)
            else:
                shares = rec.shares.to(torch.float64)
            if shares.numel() != Er:
                raise RoutingError(f"{routing.file}: a distribution over {shares.numel()} experts, the tuned shape "
                                   f"routes over {Er}")
            shares = shares.clamp(min=0) ** (1.0 + float(routing.skew))
            w, ids = _sample(shares / shares.sum(), M, top_k, gen, device)
    elif routing.skew:
        kind = "synthetic"
        w, ids = _sample(_zipf_shares(Er, routing.skew, gen), M, top_k, gen, device)
    else:
        if logits is None:
            g = torch.Generator(device=torch.device(device))
            g.manual_seed(int(seed))
            logits = torch.randn(M, Er, generator=g, device=torch.device(device), dtype=torch.float32)
        w, ids = route(M, Er, top_k, logits=logits)
    if shared:
        col = torch.arange(Er, Er + shared, device=ids.device, dtype=ids.dtype)
        ids = torch.cat([ids, col.unsqueeze(0).expand(M, shared)], dim=1).contiguous()
        sw = torch.full((M, shared), float(routing.shared_weight), device=w.device, dtype=w.dtype)
        w = torch.cat([w, sw], dim=1).contiguous()
    return w.to(torch.float32), ids.to(torch.int32), info_of(routing, ids, E, kind)


def info_of(routing: Routing, topk_ids, E: int, kind: str = "synthetic") -> dict:
    """What a report says of the routing ``topk_ids`` (int [M, k]) over ``E`` experts was timed with
    (see :func:`make`)."""
    import torch
    counts = torch.bincount(topk_ids.reshape(-1).to(torch.int64).cpu().clamp(min=0), minlength=E)
    active = counts[counts > 0]
    return {"kind": kind, "describe": routing.describe(), "shared_expert": bool(routing.shared),
            "top_k": int(topk_ids.shape[1]), "experts": int(E), "skew": float(routing.skew), "file": routing.file,
            "active_experts": int(active.numel()), "max_load": int(active.max()) if active.numel() else 0,
            "mean_load": round(float(active.float().mean()), 2) if active.numel() else 0.0}


def expert_counts(topk_ids, E: int) -> list[int]:
    """Rows each of the ``E`` experts gets from ``topk_ids`` (any int tensor [M, k]); ids outside
    ``[0, E)`` (expert parallelism's -1) are not counted."""
    import torch
    flat = topk_ids.reshape(-1).to(torch.int64).cpu()
    flat = flat[(flat >= 0) & (flat < E)]
    return torch.bincount(flat, minlength=E).tolist()
