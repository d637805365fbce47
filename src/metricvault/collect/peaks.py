"""Peak dense BF16 tensor throughput per accelerator, the denominator of model FLOPs utilisation.

MFU (PaLM, Chowdhery et al. 2022, appendix B) is achieved model FLOP/s divided by the hardware's
peak FLOP/s. Datasheets print tensor throughput *with 2:4 structured sparsity*, twice the dense
rate that training reaches at best, so every value here is the dense one (the sparse figure ÷ 2
where a datasheet only prints that). A model that is not in the table gets no MFU rather than a
guess; pass ``peak_flops=`` to ``metricvault.track`` for it.

Deliberately left out (no value we could vouch for): A10G (AWS; a cut-down A10), A800/H800,
B100, B300/GB300, MI300A, V100/T4 (no BF16 tensor cores), TPUs and consumer GeForce cards.
"""

from __future__ import annotations

import re

# Dense BF16 tensor-core FLOP/s (no sparsity), keyed by canonical model name. Source documents in
# the comments; NVIDIA values were cross-checked as SMs x boost clock x dense FLOP/clock/SM.
PEAK_BF16_DENSE_FLOPS: dict[str, float] = {
    # NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS | 624 with sparsity (SXM and PCIe).
    "A100-SXM": 312e12,
    "A100-PCIe": 312e12,
    # NVIDIA A30 datasheet: BF16 165 TFLOPS | 330 with sparsity.
    "A30": 165e12,
    # NVIDIA A10 datasheet: BF16 125 TFLOPS | 250 with sparsity.
    "A10": 125e12,
    # NVIDIA A40 datasheet: BF16 149.7 TFLOPS | 299.4 with sparsity.
    "A40": 149.7e12,
    # NVIDIA RTX A6000 datasheet / Ampere GA102 whitepaper: 309.7 TFLOPS with sparsity.
    "RTX-A6000": 154.8e12,
    # NVIDIA Ada GPU architecture whitepaper (RTX 6000 Ada): 364.2 | 728.5 with sparsity.
    "RTX-6000-Ada": 364.2e12,
    # NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity.
    "L4": 121e12,
    # NVIDIA L40 datasheet: 181.05 | 362.1 TFLOPS with sparsity.
    "L40": 181.05e12,
    # NVIDIA L40S datasheet: BF16 362.05 | 733 TFLOPS with sparsity.
    "L40S": 362.05e12,
    # NVIDIA H100 Tensor Core GPU architecture whitepaper: 989.4 dense (SXM5); the H100 datasheet
    # prints 1,979 (SXM) / 1,513 (PCIe) / 1,671 (NVL) TFLOPS with sparsity.
    "H100-SXM": 989.4e12,
    "H100-PCIe": 756e12,
    "H100-NVL": 835.5e12,
    # NVIDIA H200 datasheet: BF16 1,979 (SXM) / 1,671 (NVL) TFLOPS with sparsity.
    "H200": 989.4e12,
    "H200-NVL": 835.5e12,
    # NVIDIA GH200 Grace Hopper Superchip datasheet: BF16 1,979 TFLOPS with sparsity.
    "GH200": 989.4e12,
    # NVIDIA HGX B200 datasheet: FP16/BF16 36 PFLOPS with sparsity for 8 GPUs.
    "B200": 2.25e15,
    # NVIDIA GB200 NVL72 datasheet: FP16/BF16 360 PFLOPS with sparsity for 72 GPUs.
    "GB200": 2.5e15,
    # AMD Instinct MI250X / MI250 datasheets (CDNA 2 has no sparsity): BF16 383 / 362.1 TFLOPS.
    "MI250X": 383e12,
    "MI250": 362.1e12,
    # AMD Instinct MI300X / MI325X datasheets: BF16 1,307.4 TFLOPS | 2,614.9 with sparsity.
    "MI300X": 1307.4e12,
    "MI325X": 1307.4e12,
}

# Model token -> {form token or None (no form given): canonical name}. A model whose forms
# differ in peak and that is named without one (bare "H100") is ambiguous, hence unknown.
_FORMS: dict[str, dict[str | None, str]] = {
    "a100": {None: "A100-SXM", "sxm": "A100-SXM", "pcie": "A100-PCIe"},
    "h100": {"sxm": "H100-SXM", "pcie": "H100-PCIe", "nvl": "H100-NVL"},
    # nvidia-smi calls the SXM part "NVIDIA H200" and the PCIe card "NVIDIA H200 NVL".
    "h200": {None: "H200", "sxm": "H200", "nvl": "H200-NVL"},
    "a30": {None: "A30"},
    "a10": {None: "A10"},
    "a40": {None: "A40"},
    "a6000": {None: "RTX-A6000"},
    "6000ada": {None: "RTX-6000-Ada"},
    "l4": {None: "L4"},
    "l40": {None: "L40"},
    "l40s": {None: "L40S"},
    "gh200": {None: "GH200"},
    "b200": {None: "B200"},
    "gb200": {None: "GB200"},
    "mi250x": {None: "MI250X"},
    "mi250": {None: "MI250"},
    "mi300x": {None: "MI300X"},
    "mi325x": {None: "MI325X"},
}
_NOISE = frozenset({"nvidia", "amd", "instinct", "tesla", "tensor", "core", "gpu", "generation"})
_GLUED_FORM = re.compile(r"^([a-z]+\d+[a-z]?)(sxm\d*|pcie|nvl)$")  # "h100sxm5" -> h100 + sxm5
_MEMORY = re.compile(r"^\d+gb$")


def _tokens(name: str) -> list[str]:
    out: list[str] = []
    for token in re.findall(r"[a-z0-9]+", name.lower()):
        glued = _GLUED_FORM.match(token)
        out.extend(glued.groups() if glued else (token,))
    return [t for t in out if t not in _NOISE and not _MEMORY.match(t)]


def _form(tokens: list[str]) -> str | None:
    # NVL before HBM3: an H100 NVL also carries HBM3, but only the SXM H100 is *named* by it
    # ("NVIDIA H100 80GB HBM3" is what nvidia-smi reports for an H100 SXM).
    if "nvl" in tokens:
        return "nvl"
    if "pcie" in tokens:
        return "pcie"
    if any(t.startswith("sxm") for t in tokens) or "hbm3" in tokens:
        return "sxm"
    return None


def canonical_gpu(name: str) -> str | None:
    """The table's name for a GPU as people and drivers spell it ("h100 sxm", "NVIDIA H100
    80GB HBM3" → ``H100-SXM``), or None when unknown or ambiguous (bare "H100")."""
    tokens = _tokens(name)
    if "ada" in tokens and "6000" in tokens:
        tokens = ["6000ada"]
    model = next((t for t in tokens if t in _FORMS), None)
    if model is None:
        return None
    forms = _FORMS[model]
    if len(forms) == 1:  # one form only: whatever else the name says does not change the peak
        return forms[None]
    return forms.get(_form(tokens))


def peak_flops_for(name: str) -> float | None:
    """Dense BF16 peak FLOP/s of one GPU of this model, or None when not known."""
    canonical = canonical_gpu(name)
    return PEAK_BF16_DENSE_FLOPS[canonical] if canonical else None
