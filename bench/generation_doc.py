"""``bench.generation``'s section of docs/benchmarks.md, written from its JSON report."""

from __future__ import annotations

from typing import Any

from bench.harness import write_section

#: A Sentinel-2 tile's side in 10 m pixels: what a chip's cost is scaled to.
TILE = 10980


def _model(name: str) -> str:
    return {
        "bench-terramind-tiny-generate": "tiny (real size)",
        "test-generate": "toy (`test-generate`)",
    }.get(name, name)


def _machine(report: dict[str, Any]) -> str:
    m, run = report["machine"], report["run"]
    gpu = f"GPU {m['gpu']}" if m.get("gpu") else "no GPU"
    line = (
        f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cpu']}), {gpu}, device "
        f"`{m['device']}`, Python {m['python']}, torch {m['torch']}, {m['date']}; the whole run "
        f"took {run['seconds']} s"
    )
    if run.get("nice"):
        line += f" under `nice -n {run['nice']}`"
    if run.get("threads"):
        line += (
            f", {run['threads']} torch thread(s) (`--threads`; in a probe on this shared "
            "machine the toy model ran about 8x slower with 2: OpenMP threads waiting for cores "
            "other processes held)"
        )
    load = run["load_1min"]
    return (
        f"{line}. Other processes shared the {m['cores']} cores during the run (1-minute load "
        f"average {load[0]} at the start, {load[-1]} at the end), so absolute times are noisy; "
        "the ratios, measured in the same moments, less so."
    )


def _throughput(report: dict[str, Any]) -> list[str]:
    lines = [
        "| model | patch (stride) | scene (W x H) | patches | steps | batch | wall s | patches/s | "
        "patch-steps/s | s per token pass | s per denoising step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["throughput"]:
        kinds = r["kinds"]
        tok = [k["s_per_patch_step"] for n, k in kinds.items() if n.startswith("tokens")]
        den = [k for n, k in kinds.items() if n.startswith("denoise")]
        per_step = sum(k["seconds"] for k in den) / max(1, sum(k["patch_steps"] for k in den))
        lines.append(
            f"| {_model(r['model'])} | {r['px']} ({r['stride']}) | {r['scene'][1]} x "
            f"{r['scene'][0]} | {r['patches']} | {r['steps']} | {r['batch']} | {r['seconds']} | "
            f"{r['patches_per_s']} | {r['patch_steps_per_s']} | "
            f"{' + '.join(f'{t:.3f}' for t in tok)} | {per_step:.3f} |"
        )
    return lines


def _chip(report: dict[str, Any]) -> str:
    c = report["chip"]
    tile = (-(-TILE // (c["px"] - 32))) ** 2  # patches of a tile at the served stride
    hours = c["seconds_per_chip"] * tile / 3600
    return (
        f"**A full {c['steps']}-step {c['px']} px chip**, extrapolated plainly from the "
        f"{c['px']} px run ({c['from_steps']} steps): {c['token_s_per_patch']} s of token "
        f"passes + {c['steps']} x {c['denoise_s_per_patch_step']} s per denoising step = "
        f"**{c['seconds_per_chip']} s per patch** on this CPU (the per-step figure includes the "
        "decode that runs with the last step, so this slightly overcounts). A Sentinel-2 tile "
        f"({TILE} px square, {tile} patches at stride {c['px'] - 32}) would take about "
        f"{hours:,.0f} hours: generation at the default 50 steps is a GPU workload; on the CPU "
        "use a few steps (`--steps`) and small scenes."
    )


def _batching(report: dict[str, Any]) -> list[str]:
    b = report["batching"]
    kinds = list(b["mean_fill"])
    lines = [
        f"**Step batching** ({_model(b['model'])}, {b['px']} px patches, {b['requests']} "
        f"requests of {b['scene'][1]} x {b['scene'][0]} px, {b['steps']} steps, batch cap "
        f"{b['batch']}): the {b['requests']} requests admitted together and run to completion, "
        "against the same requests one after another (`generate_image` each), each mode on a "
        "fresh engine after one warm request. Mean batch fill (patches over the cap) per step "
        "kind from `Engine.step_stats`.",
        "",
        "| mode | wall s | patches | " + " | ".join(f"fill {k}" for k in kinds) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in kinds) + " |",
    ]
    for mode in ("concurrent", "sequential"):
        r = b[mode]
        fills = " | ".join(str(b["mean_fill"][k][mode]) for k in kinds)
        lines.append(f"| {mode} | {r['seconds']} | {r['patches']} | {fills} |")
    same = "yes" if b["same_bytes"] else "no"
    invariant = "on" if report["run"]["batch_invariant"] else "off"
    lines += [
        "",
        f"Sequential / concurrent wall time: **{b['ratio']}x**. Outputs the same bytes in both "
        f"modes (batch-invariant {invariant}): {same}. The fill shows the engine merging the "
        "requests' steps; what that saves depends on the networks: batch-invariant generation "
        "(the default) runs each network one patch at a time inside a batch, so that a patch's "
        "bytes never depend on its company, and then a full batch saves only the work around "
        "the networks. With `--batch-invariant off` (one call per batch; the GPU preset) "
        "batching is where a GPU gains.",
    ]
    return lines


def _seams(report: dict[str, Any]) -> list[str]:
    s = report["seams"]
    lines = [
        f"**Seams** ({_model(s['model'])}, {s['px']} px patches, a {s['scene'][1]} x "
        f"{s['scene'][0]} px scene, {s['steps']} steps, seed 5): the mean difference between "
        "adjacent pixels across the grid's core boundaries (every multiple of the stride: where "
        "`center` switches patch, `none` has its patch edges and `cosine`'s weights cross) "
        "over the same inside the cores, horizontal and vertical neighbours together; `s1grd`: "
        "mean |difference| in dB over VV and VH; `lulc`: the share of neighbours whose class "
        "differs. Ratio 1.0: a border looks like any other step; above 1: a visible line. "
        "*Grid-matched*: border over the inside pairs at the same place in the 16 px token "
        "grid (every multiple of 16 that is no core boundary): TerraMind's UNet works on 4 x 4 "
        "pixel blocks (its input is pixel-unshuffled by 4) and leaves structure of that period "
        "in its output; the borders all sit on one phase of it, "
        "which moves the plain ratio either way (see the horizontal and vertical columns).",
        "",
        "| blend | stride | product | border | inside | ratio | grid-matched inside | "
        "grid-matched ratio | ratio (horizontal neighbours) | ratio (vertical) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["rows"]:
        lines.append(
            f"| {r['blend']} | {r['stride']} | {r['product']} | {r['border']} | {r['inside']} | "
            f"**{r['ratio']}** | {r['control']} | **{r['ratio_grid']}** | {r['ratio_h']} | "
            f"{r['ratio_v']} |"
        )
    worst = max(s["rows"], key=lambda r: r["ratio_grid"])
    lulc = [r["inside"] for r in s["rows"] if r["product"] == "lulc"]
    lines += [
        "",
        f"Largest grid-matched ratio: {worst['ratio_grid']} ({worst['blend']}, "
        f"{worst['product']}). With random weights both products are pixel-scale noise (the "
        f"land-cover class differs for {min(lulc):.0%} to {max(lulc):.0%} of neighbouring "
        "pixels inside the cores), so this measures what serving adds at a border (initial "
        "noise and token draws keyed to the scene, so overlapping patches share them, and the "
        "blend), not how "
        "a trained model's smoother images would look. Below 1 the border steps are smaller "
        "than the inside ones: `cosine` averages two patches' outputs over the overlap band, "
        "which evens them out; `none` puts its borders at patch edges, where the UNet's output "
        "steps are smaller (its convolutions' zero padding); `center` switches patch at a "
        "core boundary 16 px inside both patches.",
    ]
    return lines


def write_markdown(report: dict[str, Any]) -> None:
    """Rewrite the ``generation`` section of docs/benchmarks.md from ``report``."""
    lines = [
        "TerraMind v1 tiny any-to-any generation as served (`TerraMindGenerate`, the plugin's "
        "`terramind-v1-tiny-generate` at real size: its generator and the full-size S1GRD "
        "DiVAE and LULC VQVAE decoders, about 304 M parameters, random weights moved off "
        "their initialisation), S2L2A in, S1GRD + LULC out, through `Engine.generate_image` "
        "from GeoTIFF to GeoTIFFs (seeded synthetic 12-band scenes; batch-invariant "
        f"{'on, the default' if report['run']['batch_invariant'] else 'off'}). A patch's plan "
        "is one token pass per output, then one UNet call per denoising step; LULC is decoded "
        "with the last step.",
        "",
        _machine(report),
        "",
        "**Throughput** (one warm request first; patches/s end to end, patch-steps/s of the "
        "step calls alone; seconds per token pass (S1GRD + LULC) and per denoising step, per "
        "patch):",
        "",
        *_throughput(report),
        "",
        _chip(report),
        "",
        *_batching(report),
        "",
        *_seams(report),
        "",
        "**On a GPU** (not run yet): `python -m bench.generation --gpu` (from the repository "
        "root, on a machine with a CUDA GPU) sets device `cuda`, batch 64, batch-invariant off "
        "(one network call per step batch), torch's own thread count, 50 steps at both patch "
        "sizes on 512 x 512 (64 px patches) and 768 x 768 px (224 px) scenes, 8 requests of "
        "256 px at 10 steps for batching and a 512 px seam scene at 50 steps; each of these "
        "has its own flag (`--device`, `--batch`, `--batch-invariant`, `--steps-224`, "
        "`--width-224`, ...; `--help` lists them) that overrides the preset. `--quick` runs "
        "the toy model `test-generate` in seconds (the test's mode; it leaves this page alone).",
    ]
    write_section("generation", "Served TerraMind generation", lines)
