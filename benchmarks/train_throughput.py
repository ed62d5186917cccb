"""Training throughput: the TokMem step against a naive resized-vocabulary step and a LoRA step.

All three train on the same batches in the same run:
  tokmem  only the bank rows are parameters; vocabulary logits only at labelled positions
  naive   the usual recipe: resize the vocabulary, make the whole embedding matrix trainable and
          mask the gradient of the old rows; full logits at every position
  lora    PEFT LoRA r=8 on q_proj and v_proj (memory ids replaced by EOS: it has no memory tokens)

    python benchmarks/train_throughput.py [--backbone smollm2-135m] [--steps 6] --json runs/throughput.json
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from tokmem import create, load_backbone
from tokmem.data.builtin import demo_dataset
from tokmem.sequences import collate, encode
from tokmem.report import console, machine, write_json


def batches(model, batch_size: int, count: int) -> list[dict]:
    bank = model.bank
    train, _ = demo_dataset(seed=0)
    bank.add(sorted({p for e in train for p in e.procedures}), model.backbone.mean_embedding())
    tokenizer = model.backbone.tokenizer
    encoded = [encode(e, tokenizer, model.memory_id, 1024) for e in train[: batch_size * count]]
    return [collate(encoded[i : i + batch_size], tokenizer.pad_token_id) for i in range(0, len(encoded), batch_size)]


def tokmem_step(model):
    optimizer = torch.optim.AdamW(model.unfreeze_rows(), lr=5e-3, weight_decay=0.0)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model.loss(batch)
        loss.backward()
        optimizer.step()

    return step


def naive_step(backbone, rows: int):
    lm = copy.deepcopy(backbone.model)
    vocab = backbone.vocab_size
    lm.resize_token_embeddings(vocab + rows)
    weight = lm.get_input_embeddings().weight
    weight.requires_grad_(True)
    weight.register_hook(lambda grad: torch.cat([torch.zeros_like(grad[:vocab]), grad[vocab:]]))
    optimizer = torch.optim.AdamW([weight], lr=5e-3, weight_decay=0.0)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss.backward()
        optimizer.step()

    return step


def lora_step(backbone):
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(copy.deepcopy(backbone.model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=5e-5, weight_decay=0.01)
    vocab, eos = backbone.vocab_size, backbone.eos_token_id

    def step(batch):
        ids = batch["input_ids"].masked_fill(batch["input_ids"] >= vocab, eos)
        labels = batch["labels"].masked_fill(batch["labels"] >= vocab, eos)
        optimizer.zero_grad(set_to_none=True)
        lm(input_ids=ids, attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()

    return step


def tokens_per_second(steps: dict, data, warmup: int = 1) -> dict:
    """Tokens/s of each step function; the methods take turns batch by batch, so that a change in
    the machine's load during the run affects them alike."""
    seconds = dict.fromkeys(steps, 0.0)
    for i, batch in enumerate(data):
        for name, step in steps.items():
            start = time.perf_counter()
            step(batch)
            if i >= warmup:
                seconds[name] += time.perf_counter() - start
    tokens = sum(int(b["attention_mask"].sum()) for b in data[warmup:])
    return {name: tokens / s for name, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per method (after one warm-up step)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.manual_seed(0)
    backbone = load_backbone(args.backbone)
    model = create(backbone)
    data = batches(model, args.batch_size, args.steps + 1)
    steps = {"tokmem": tokmem_step(model), "naive": naive_step(backbone, len(model.bank)), "lora": lora_step(backbone)}
    results = {f"{name}_tokens_per_s": rate for name, rate in tokens_per_second(steps, data).items()}
    for name in steps:
        console.print(f"{name:>7}: {results[f'{name}_tokens_per_s']:.0f} tokens/s")
    for name in ("naive", "lora"):
        console.print(f"tokmem / {name}: {results['tokmem_tokens_per_s'] / results[f'{name}_tokens_per_s']:.2f}×")
    if args.json:
        tokens = sum(int(b["attention_mask"].sum()) for b in data)
        write_json(args.json, {**results, "backbone": args.backbone, "batch_size": args.batch_size, "steps": args.steps, "tokens": tokens, "machine": machine()})


if __name__ == "__main__":
    main()
