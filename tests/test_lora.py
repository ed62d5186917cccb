"""LoRA's settings: what an adapter adds to a backbone."""

from tokmem.training.lora import Adapter, LoRASettings


def test_the_settings_count_the_adapter_weights_they_add_without_injecting(backbone):
    settings = LoRASettings(rank=4)
    assert settings.parameter_count(backbone.model) == Adapter(backbone.model, settings).parameter_count() > 0
