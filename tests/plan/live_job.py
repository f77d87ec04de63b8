"""A small real training job on CPU with the anatomy hook, for `plan --like` tests and the closing figures.

``python tests/plan/live_job.py --family llama|t5|whisper [--lora R] [--lora-dropout P] [--quant nf4]``
builds the model from a small config (random weights, nothing downloaded) as users build it — PEFT's
``get_peft_model`` with its default target modules, a 4-bit base loaded by transformers from a saved
checkpoint with a ``BitsAndBytesConfig`` — and trains it with AdamW, the batch passed by keyword as a
Trainer passes it, in a plain loop (``out = model(**batch)`` held until the next forward) or with
``--drop-outputs`` keeping only the loss, as the Trainer does. After ``--steps`` it prints "lingering" and
keeps publishing the last snapshot until killed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from typing import Any

import torch


def config_of(family: str) -> Any:
    import transformers

    if family == "llama":
        return transformers.LlamaConfig(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    if family == "t5":
        t5 = {"d_model": 64, "d_kv": 16, "d_ff": 256, "num_layers": 2, "num_heads": 4}
        return transformers.T5Config(vocab_size=1000, decoder_start_token_id=0, **t5)
    return transformers.WhisperConfig(
        vocab_size=1000,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=64,  # a window of 128 frames (1.28 s), as Whisper's 1500 are 3000 (30 s)
        max_target_positions=64,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )


def build(family: str, lora: int | None, dropout: float, quant: str | None) -> torch.nn.Module:
    import transformers

    auto = {
        "llama": transformers.AutoModelForCausalLM,
        "t5": transformers.AutoModelForSeq2SeqLM,
        "whisper": transformers.AutoModelForSpeechSeq2Seq,
    }[family]
    cfg = config_of(family)
    if quant is None:
        model = auto.from_config(cfg)
    else:
        qconfig = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        with tempfile.TemporaryDirectory() as tmp:
            auto.from_config(cfg).save_pretrained(tmp)
            model = auto.from_pretrained(tmp, quantization_config=qconfig, device_map="cpu")
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora, lora_dropout=dropout))
    return model


def batch_of(family: str, batch: int, seq: int, target: int) -> dict[str, torch.Tensor]:
    cfg = config_of(family)
    if family == "whisper":
        frames = 2 * cfg.max_source_positions
        return {
            "input_features": torch.randn(batch, cfg.num_mel_bins, frames),
            "labels": torch.randint(3, cfg.vocab_size, (batch, target)),
        }
    ids = torch.randint(3, cfg.vocab_size, (batch, seq))
    if family == "t5":
        return {"input_ids": ids, "labels": torch.randint(3, cfg.vocab_size, (batch, target))}
    return {"input_ids": ids, "labels": ids.clone()}


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the hook closes and removes its socket


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--family", choices=["llama", "t5", "whisper"], default="llama")
    p.add_argument("--lora", type=int)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--quant", choices=["nf4", "fp4"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--target", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument(
        "--drop-outputs", action="store_true", help="keep only the loss of the outputs, as the Trainer does"
    )
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_signal)
    import anatomy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(args.family, args.lora, args.lora_dropout, args.quant)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    tracker = anatomy.track(model, optimizer, interval_s=args.interval, sample_every=2)
    out = None
    try:
        for step in range(1, args.steps + 1):
            if step == args.steps:
                time.sleep(args.interval)  # the last step's snapshot is due when it ends
            inputs = batch_of(args.family, args.batch, args.seq, args.target)
            with tracker.step():
                if args.drop_outputs:
                    model(**inputs).loss.backward()
                else:
                    out = model(**inputs)
                    out.loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        print("live_job: lingering", flush=True)
        while True:
            time.sleep(3600)
    finally:
        del out
        tracker.close()


if __name__ == "__main__":
    sys.exit(main())
