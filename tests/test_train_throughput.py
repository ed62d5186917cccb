"""The training-throughput benchmark: one run reports both methods on the same examples, from the library's training."""

import argparse

from helpers import load_script

train_throughput = load_script("train_throughput")


def test_the_benchmark_reports_both_methods_and_segment_backprop_and_kept_prefixes_cut_tokmems_later_epochs_flops():
    args = argparse.Namespace(
        backbone="tiny-random",
        device="cpu",
        dtype=None,
        workload="demo",
        examples=8,
        batch_size=4,
        epochs=2,
        lora_batches=(2, 4),
        peak_size=64,
    )
    result = train_throughput.run(args)
    assert {"tokmem_epoch1_tokens_per_s", "tokmem_epoch2_tokens_per_s", "lora_tokens_per_s", "tokmem_mfu"} <= set(
        result
    )
    assert len(result["tokmem_epoch_s"]) == 2 and set(result["lora_epoch_s_by_batch"]) == {2, 4}
    assert result["lora_epoch_s"] == min(result["lora_epoch_s_by_batch"].values())
    assert result["prefix_cache_bytes"] > 0 and 0 < result["padding_share"] < 1
    flops = result["flops_per_token"]
    assert flops["tokmem_epoch2"] < flops["tokmem_epoch1"] < flops["lora"]
    # the demo's records are one segment each: segment_backprop takes the exact path, the same steps
    assert len(result["tokmem_segments_epoch_s"]) == 2 and result["tokmem_segments_epoch2_tokens_per_s"] > 0
    assert result["tokmem_segments_final_loss"] == result["tokmem_final_loss"]
    assert flops["tokmem_segments_epoch2"] == flops["tokmem_epoch2"]
