"""Compiling Triton kernels for the GPU's target in CPU processes that never touch CUDA.

Why: a compile worker that launches the kernel in compile-only mode needs a CUDA context and, for
SGLang's kernel, the problem's buffers on the GPU: 7-10 GiB each on the H200 (see
``SglangProvider.compile_workers``), so compile parallelism followed GPU memory, not CPU cores.
Triton compiles for an explicit target without any GPU (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))``; ptxas ships with Triton), and its on-disk cache key is
``get_cache_key(src, backend, options, env)``, the same whether the compile comes from a launch
or from a direct call (Triton 3.3-3.9 ``python/triton/compiler/compiler.py``, ``compile``).

The method, in two halves:

- :func:`capture` (timing process, which holds the GPU): run the kernel's own launch code (e.g.
  SGLang's ``invoke_fused_moe_kernel``) with each ``JITFunction``'s ``compile`` replaced by a
  recorder. Triton's launch path (``JITFunction.run`` -> ``_do_compile``) binds the arguments,
  specialises them (dtypes, 16-byte alignment, ``== 1`` integers, tensor descriptors), parses
  the options (num_warps, num_stages, launch_pdl, ...) and calls ``self.compile(src,
  target=..., options=...)``; the recorder keeps exactly that ``(src, target, options)`` as a
  picklable :class:`KernelSpec` and stops the launch (nothing runs on the GPU, nothing is
  cached in memory). A kernel already loaded in this process is not captured again.
- :func:`compile_specs` (worker process, ``CUDA_VISIBLE_DEVICES=""``, no CUDA context, see
  :func:`worker_init`): import the kernel's module, rebuild the ``ASTSource`` and call
  ``triton.compile`` for the recorded target and options. The artifact lands in
  ``TRITON_CACHE_DIR`` under the key the launch computes, so the timing process's first launch
  of the candidate reads it from disk (a cache hit) instead of compiling.

Where either half cannot run (a Triton whose launch path differs, a kernel module the worker
cannot import), :func:`available` / :class:`CaptureError` say why and the caller falls back to
compiling in processes with a CUDA context (:mod:`remote.tuning.tuner.compile`).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field

from ...protocol import internal_error

#: Set in compile workers before anything imports torch: no GPU is visible to them.
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class KernelSpec:
    """One Triton compile as a launch would request it (picklable).

    ``fn``: ``"module:qualname"`` of the ``@triton.jit`` function; ``signature``: ``{arg name:
    type string}`` (``"*bf16"``, ``"i32"``, ``"constexpr"``, ``"tensordesc<...>"``);
    ``constexprs``: ``{(arg index,): value}`` (ints, bools, ``tl.dtype``; a JIT function as
    ``("jit", "module:qualname")``); ``attrs``: ``{(arg index,): [[attribute, value]]}``
    (e.g. ``tt.divisibility`` 16); ``options``: the backend options dict (num_warps,
    num_stages, ...); ``target``: ``(backend, arch, warp_size)``, e.g. ``("cuda", 90, 32)``."""

    fn: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    target: tuple
    key: str = field(default="", compare=False)

    def ident(self) -> str:
        """A stable identity of this compile (dedup across batch sizes and GEMMs)."""
        import hashlib
        text = repr((self.fn, sorted(self.signature.items()), sorted(self.constexprs.items(), key=repr),
                     sorted(self.attrs.items(), key=repr), sorted(self.options.items(), key=repr), self.target))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@internal_error("compile.TargetCompiler catches it and falls back to context workers, keeping the reason")
class CaptureError(RuntimeError):
    """The launch code could not be captured (the message says why); the caller falls back."""


@internal_error("raised and caught inside capture(): it stops a launch once its compile request is kept")
class _Captured(Exception):
    """Raised by the recorder to stop a launch once its compile request is kept."""


def available() -> str | None:
    """None when this Triton can compile for an explicit target from a captured launch, else the
    reason (e.g. ``"TRITON_INTERPRET=1: nothing is compiled"``)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1: nothing is compiled"
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource
        from triton.runtime.jit import JITFunction
    except Exception as exc:
        return f"this Triton has no target compile API ({type(exc).__name__}: {exc})"
    import inspect
    params = inspect.signature(ASTSource.__init__).parameters
    if "constexprs" not in params and "constants" not in params:
        return f"Triton {triton.__version__}: ASTSource takes no constexprs"
    if "target" not in inspect.signature(triton.compile).parameters:
        return f"Triton {triton.__version__}: triton.compile takes no target"
    if not hasattr(JITFunction, "create_binder"):
        return f"Triton {triton.__version__}: JITFunction has no create_binder (launch path not known)"
    return None


def jit_functions(module) -> list:
    """The ``JITFunction`` objects defined at the top level of ``module``."""
    from triton.runtime.jit import JITFunction
    return [v for v in vars(module).values() if isinstance(v, JITFunction)]


def _encode(value):
    from triton.runtime.jit import JITFunction
    if isinstance(value, JITFunction):
        return ("jit", f"{value.fn.__module__}:{value.fn.__qualname__}")
    return value


def _decode(value):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "jit":
        return _resolve(value[1])
    return value


def _resolve(name: str):
    mod, _, qual = name.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def capture(fns: list, launch) -> list[KernelSpec]:
    """Run ``launch()`` (zero-argument: the kernel's own launch code, on the real tensors) with
    the compile step of every JITFunction in ``fns`` replaced by a recorder; returns the compile
    requests it made, in order (empty when every kernel it launches is already loaded in this
    process; nothing runs on the GPU either way: the kernels are in Triton's compile-only mode,
    ``warmup=True``, meanwhile). Only the first kernel launch is captured: the recorder stops
    ``launch`` there (a GEMM launcher launches one kernel last). Needs the GPU's driver (the caller's process).
    Raises :class:`CaptureError` when the launch failed for another reason or this Triton's
    launch path has no ``compile`` attribute to replace."""
    from triton.runtime import driver
    got: list[KernelSpec] = []
    device = driver.active.get_current_device()
    saved = []
    try:
        for jf in fns:
            jf.device_caches[device]  # noqa: B018 (builds the binder, which sets jf.compile)
            if not callable(getattr(jf, "compile", None)):
                raise CaptureError("JITFunction has no compile attribute after create_binder: launch path unknown")
            saved.append((jf, jf.__dict__.get("compile"), jf.__dict__.get("run")))
            # compile-only mode: a kernel already loaded here returns without running on the GPU
            jf.run = (lambda _run: lambda *a, **kw: _run(*a, **dict(kw, warmup=True)))(jf.run)

            def recorder(src, target=None, options=None, _jf=jf, **_kw):
                fn = src.fn
                got.append(KernelSpec(fn=f"{fn.fn.__module__}:{fn.fn.__qualname__}", signature=dict(src.signature),
                                      constexprs={k: _encode(v) for k, v in src.constants.items()},
                                      attrs=dict(src.attrs), options=dict(options or {}),
                                      target=(target.backend, target.arch, target.warp_size)))
                raise _Captured()
            jf.compile = recorder
        try:
            launch()
        except _Captured:
            pass
        except Exception as exc:
            raise CaptureError(f"launch code failed under capture: {type(exc).__name__}: {str(exc)[:300]}") from exc
    finally:
        for jf, orig, run in saved:
            if orig is None:
                jf.__dict__.pop("compile", None)
            else:
                jf.compile = orig
            if run is None:
                jf.__dict__.pop("run", None)
            else:
                jf.run = run
    return got


def cuda_in_use() -> str | None:
    """Why this process would hold a CUDA context, or None: torch imported with CUDA initialised,
    or a visible GPU (``CUDA_VISIBLE_DEVICES`` not empty)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) != "":
        return f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return "torch.cuda is initialised"
        except Exception:
            pass
    return None


def worker_init() -> None:
    """Initializer of a compile worker: hide every GPU before anything imports torch or a CUDA
    library (the worker then cannot create a CUDA context, whatever it imports)."""
    os.environ.update(HIDE_GPUS)


def compile_specs(specs: list) -> tuple[bool, str]:
    """Compile each :class:`KernelSpec` for its target (worker side); ``(ok, error_text)``, never
    raises. Refuses to run where CUDA is visible or initialised (:func:`cuda_in_use`), and checks
    again after compiling: a kernel module that initialised CUDA on import gives ``(True, note)``."""
    try:
        why = cuda_in_use()
        if why:
            return False, f"compile worker would use CUDA ({why})"
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        for s in specs:
            fn = _resolve(s.fn)
            src = ASTSource(fn, dict(s.signature), {k: _decode(v) for k, v in s.constexprs.items()}, dict(s.attrs))
            triton.compile(src, target=GPUTarget(*s.target), options=dict(s.options))
        why = cuda_in_use()
        if why:  # compiled all the same; the caller reports it
            return True, f"compile worker: CUDA was initialised while compiling ({why})"
        return True, ""
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"
