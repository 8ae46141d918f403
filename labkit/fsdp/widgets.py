"""Memory-per-GPU explorer: a model under DP, ZeRO-1, ZeRO-2, ZeRO-3 (FSDP), each with a
tensor-parallel degree, fed by the formulas.

``memory_explorer()`` returns a VBox: a model menu (the catalog's presets), sliders for the
data-parallel ranks N, the tensor-parallel degree t, the micro-batch and the sequence length, a
precision switch (mixed: 2 + 2 + 12 bytes a parameter; the lab's fp32: 4 + 4 + 8), a table and
the bars. Weights, gradients and optimizer states come from
:func:`labkit.fsdp.formulas.state_bytes` (everything divided by t; ZeRO divides by N what its
stage shards), activations from the performance model's
(:func:`labkit.perfmodel.model.memory_per_gpu`: Korthikanti et al., 16-bit values, flash
attention, divided by t; data parallelism does not shard them). The figure is drawn when the
explorer is built and set as the output widget's state, so an executed notebook (and the
website made from it) shows it without a running kernel.
"""

from __future__ import annotations

from labkit.explorer import Control, Live, page_html, png_of
from labkit.figures import png_outputs
from labkit.fsdp.formulas import LAB_BYTES, MIXED_BYTES, STAGES, state_bytes

PRECISIONS = {"mixed": MIXED_BYTES, "fp32": LAB_BYTES}
NAMES = {"ddp": "DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3 (FSDP)"}
PRESETS = ("Llama-3-8B", "Llama-3-70B", "GPT-3-175B")


def breakdown(*, params: float, dp: int, tp: int = 1, activation_bytes: float = 0.0,
              precision: str = "mixed") -> list[dict]:
    """Bytes per GPU under each ZeRO stage at ``dp`` data-parallel ranks and TP degree ``tp``:
    one dict per stage (``strategy``, ``params``, ``gradients``, ``optimizer``,
    ``activations``, ``total``).

    >>> [round(r["total"] / 1e9, 1) for r in breakdown(params=7.5e9, dp=64)]
    [120.0, 31.4, 16.6, 1.9]
    >>> [r["strategy"] for r in breakdown(params=8e9, dp=8, tp=2)][-1]
    'ZeRO-3 (FSDP), TP=2'
    """
    per = PRECISIONS[precision]
    out = []
    for stage in STAGES:
        s = state_bytes(params=params, stage=stage, dp=dp, tp=tp, **per)
        name = NAMES[stage] + (f", TP={tp}" if tp > 1 else "")
        out.append({"strategy": name, "params": s["params"], "gradients": s["gradients"],
                    "optimizer": s["optimizer"], "activations": activation_bytes,
                    "total": s["total"] + activation_bytes})
    return out


def activations(model: str, *, dp: int, tp: int, micro_batch: int, seq_len: int) -> float:
    """Activation bytes per GPU of a catalog model (its name, or its preset already looked
    up: the performance model's formula)."""
    from labkit.perfmodel.catalog import model_preset
    from labkit.perfmodel.model import Layout, Workload, memory_per_gpu

    spec = model_preset(model) if isinstance(model, str) else model
    work = Workload(spec, global_batch_size=dp * micro_batch, seq_len=seq_len)
    return memory_per_gpu(work, Layout(dp=dp, tp=tp))["activations"]


def readout(rows: list[dict], gpu_memory_gb: float) -> str:
    """The numbers beside the bars, as an HTML table (GB per GPU).

    >>> "<td>ZeRO-1</td>" in readout(breakdown(params=7.5e9, dp=64), 80)
    True
    """
    head = ("<tr><th>strategy</th><th>weights</th><th>gradients</th><th>optimizer</th>"
            "<th>activations</th><th>total</th><th>fits?</th></tr>")
    body = "".join(
        f"<tr><td>{r['strategy']}</td>" + "".join(
            f"<td>{r[k] / 1e9:.1f}</td>" for k in ("params", "gradients", "optimizer",
                                                    "activations", "total"))
        + f"<td>{'yes' if r['total'] / 1e9 <= gpu_memory_gb else 'no'}</td></tr>"
        for r in rows)
    return (f'<table class="table table-sm table-striped small">{head}{body}</table>'
            f"<small>GB per GPU; GPU memory {gpu_memory_gb:g} GB</small>")


def memory_explorer(model: str = "Llama-3-8B", *, dp: int = 8, tp: int = 1, micro_batch: int = 1,
                    seq_len: int = 4096, precision: str = "mixed", gpu_memory_gb: float = 80.0):
    """The explorer widget (see the module's docstring)."""
    import ipywidgets as w

    from labkit.fsdp.plots import memory_per_gpu
    from labkit.perfmodel.catalog import model_preset

    powers = [2 ** k for k in range(11)]
    menu = w.Dropdown(options=PRESETS, value=model, description="model")
    n = w.SelectionSlider(options=powers, value=dp, description="DP ranks N",
                          continuous_update=False, style={"description_width": "initial"})
    t = w.SelectionSlider(options=[1, 2, 4, 8], value=tp, description="TP degree t",
                          continuous_update=False, style={"description_width": "initial"})
    mb = w.IntSlider(value=micro_batch, min=1, max=16, description="micro-batch",
                     continuous_update=False)
    s = w.SelectionSlider(options=[1024, 2048, 4096, 8192], value=seq_len,
                          description="seq length", continuous_update=False,
                          style={"description_width": "initial"})
    prec = w.ToggleButtons(options=list(PRECISIONS), value=precision, description="precision")
    text, plot = w.HTML(), w.Output()

    def redraw(_change=None):
        spec = model_preset(menu.value)
        rows = breakdown(params=spec.params, dp=n.value, tp=t.value, precision=prec.value,
                         activation_bytes=activations(menu.value, dp=n.value, tp=t.value,
                                                      micro_batch=mb.value, seq_len=s.value))
        text.value = readout(rows, gpu_memory_gb)
        fig = memory_per_gpu(rows, gpu_memory_gb=gpu_memory_gb,
                             title=f"{spec.name}: {spec.params / 1e9:.1f} B parameters, "
                                   f"N = {n.value}, t = {t.value}")
        plot.outputs = png_outputs(fig, f"memory per GPU, {menu.value}")

    for c in (menu, n, t, mb, s, prec):
        c.observe(redraw, names="value")
    redraw()
    return Live(w.VBox([w.HBox([menu, prec]), w.HBox([n, t]), w.HBox([mb, s]), text, plot]),
                page_explorer(model, dp=dp, tp=tp, micro_batch=micro_batch, seq_len=seq_len,
                              precision=precision, gpu_memory_gb=gpu_memory_gb,
                              figure=png_of(plot.outputs)))


def page_explorer(model: str = "Llama-3-8B", *, dp: int = 8, tp: int = 1, micro_batch: int = 1,
                  seq_len: int = 4096, precision: str = "mixed", gpu_memory_gb: float = 80.0,
                  figure=None) -> str:
    """The explorer for a page without a kernel (:mod:`labkit.explorer`): the same controls,
    micro-batches in powers of two."""
    from functools import cache, lru_cache

    from labkit.perfmodel.catalog import model_preset

    preset = lru_cache(maxsize=None)(model_preset)

    @cache
    def act(model, dp, tp, micro_batch, seq_len):
        return activations(preset(model), dp=dp, tp=tp, micro_batch=micro_batch, seq_len=seq_len)

    def text(model, dp, tp, micro_batch, seq_len, precision):
        rows = breakdown(params=preset(model).params, dp=dp, tp=tp, precision=precision,
                         activation_bytes=act(model, dp, tp, micro_batch, seq_len))
        return readout(rows, gpu_memory_gb)

    return page_html(
        [Control("model", "model", PRESETS, model),
         Control("dp", "DP ranks N", tuple(2 ** k for k in range(11)), dp),
         Control("tp", "TP degree t", (1, 2, 4, 8), tp),
         Control("micro_batch", "micro-batch", (1, 2, 4, 8, 16), micro_batch),
         Control("seq_len", "seq length", (1024, 2048, 4096, 8192), seq_len),
         Control("precision", "precision", tuple(PRECISIONS), precision)],
        text, title="Memory per GPU explorer", figure=figure,
        note="The bars show the values the notebook ran with; redrawing them needs Python "
             "(run the notebook in JupyterLab).")
