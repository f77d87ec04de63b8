"""The training-anatomy guide's memory techniques, with the speed each costs or buys as the guide
measured it. Stdlib only: the advisor (run inside the hook) and `anatomy-top plan` share this table.

Speed factors are samples/s relative to the guide's baseline run: BERT-large, batch 4, seq 512, on a
V100-16GB with the HF Trainer (baseline 8.86 samples/s, 14949 MB). They are a guide figure about one
model on one GPU, labelled as such wherever they are shown — never a prediction for this model.
"""

from __future__ import annotations

from dataclasses import dataclass

from anatomy.vocabulary import Source

GUIDE_SOURCE = "guide, BERT-large on V100"
GUIDE_SOURCE_SHORT = "BERT-L/V100"  # the same, in a table column
GUIDE_MEASURED_ON = "BERT-large, batch 4 x 512, HF Trainer, on a V100-16GB"
GUIDE_BASELINE_SAMPLES_PER_S = 8.86
GUIDE_BASELINE_MEMORY_MB = 14949
# "the kernels alone take up 1.3GB": nvidia-smi's 1343 MB (MiB) after a 1x1 tensor on the guide's V100.
GUIDE_CUDA_CONTEXT_BYTES = 1343 * (1 << 20)

# Technique keys: also the keys of the ``savings`` mapping the advisor accepts.
GRAD_ACCUM = "gradient_accumulation"
CHECKPOINTING = "gradient_checkpointing"
MIXED_PRECISION = "mixed_precision"
ADAMW_8BIT = "adamw_8bit"
ADAFACTOR = "adafactor"
PAGED_ADAMW_8BIT = "paged_adamw_8bit"
LORA = "lora"
QLORA = "qlora"
TF32 = "tf32"


@dataclass(frozen=True)
class Technique:
    key: str
    label: str
    how: str  # the one line that turns it on
    speed_factor: float | None  # samples/s relative to the guide's baseline; None: the guide gives none
    guide_samples_per_s: float | None
    guide_memory_mb: int | None  # nvidia-smi in the guide with this technique alone
    source: Source = Source.GUIDE
    source_label: str = GUIDE_SOURCE


def _factor(samples_per_s: float) -> float:
    return round(samples_per_s / GUIDE_BASELINE_SAMPLES_PER_S, 3)


TECHNIQUES: dict[str, Technique] = {
    GRAD_ACCUM: Technique(
        GRAD_ACCUM,
        "Gradient accumulation",
        "TrainingArguments(per_device_train_batch_size=B/k, gradient_accumulation_steps=k)",
        _factor(7.75),
        7.75,
        8681,
    ),
    CHECKPOINTING: Technique(
        CHECKPOINTING,
        "Gradient checkpointing",
        "model.gradient_checkpointing_enable() / TrainingArguments(gradient_checkpointing=True)",
        _factor(5.99),
        5.99,
        6775,
    ),
    MIXED_PRECISION: Technique(
        MIXED_PRECISION,
        "Mixed precision",
        "TrainingArguments(fp16=True) or bf16=True / torch.autocast(device_type='cuda', dtype=...)",
        _factor(18.64),
        18.64,
        13939,
    ),
    ADAMW_8BIT: Technique(
        ADAMW_8BIT,
        "8-bit AdamW",
        "bnb.optim.AdamW8bit(...) / TrainingArguments(optim='adamw_bnb_8bit')",
        None,
        None,
        None,
    ),
    ADAFACTOR: Technique(
        ADAFACTOR,
        "Adafactor",
        "TrainingArguments(optim='adafactor')",
        None,
        None,
        None,
    ),
    PAGED_ADAMW_8BIT: Technique(
        PAGED_ADAMW_8BIT,
        "Paged 8-bit AdamW",
        "bnb.optim.PagedAdamW8bit(...) / TrainingArguments(optim='paged_adamw_8bit')",
        None,
        None,
        None,
    ),
    LORA: Technique(
        LORA,
        "LoRA (r=8)",
        "peft.get_peft_model(model, LoraConfig(r=8)): adapters train, the base is frozen",
        None,
        None,
        None,
    ),
    QLORA: Technique(
        QLORA,
        "QLoRA (nf4, r=8)",
        "from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
        "bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)) "
        "+ LoraConfig(r=8)",
        None,
        None,
        None,
    ),
    TF32: Technique(
        TF32,
        "TF32 matmuls",
        "torch.backends.cuda.matmul.allow_tf32 = True / TrainingArguments(tf32=True)",
        None,  # the guide: "up to 3x throughput", not a measured samples/s
        None,
        None,
    ),
}


def combined_speed_factor(keys: list[str] | tuple[str, ...]) -> float | None:
    """Product of the guide factors of ``keys`` (techniques without a figure count as 1.0); None when
    no technique in ``keys`` has a figure. An estimate: the guide measured each technique alone."""
    factors = [TECHNIQUES[k].speed_factor for k in keys if k in TECHNIQUES]
    known = [f for f in factors if f is not None]
    if not known:
        return None
    out = 1.0
    for f in known:
        out *= f
    return round(out, 3)
