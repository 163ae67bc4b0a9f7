"""The tinker-cookbook's DPO (tinker_cookbook.preference.train_dpo.main), unmodified, against an
`opentinker serve` on loopback: comparisons of our own (which reply to prefer), written as the
JSONL its ComparisonBuilderFromJsonl reads and turned into chosen / rejected datums by its
DPODatasetBuilderFromComparisons; a LoRA on the served tiny model trains on them with the DPO
loss, which the cookbook computes on the client from the server's logprobs of the policy and of
the reference (`forward_backward_custom`). The tiny model is served under its directory's path,
where the cookbook's get_tokenizer reads it: nothing comes from the hub.

Usage: dpo_letters.py LOG_DIR
Environment: TINKER_BASE_URL, TINKER_API_KEY, OPENTINKER_MODEL_DIR."""

import json
import os
import sys
from pathlib import Path

from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

MODEL = os.environ["OPENTINKER_MODEL_DIR"]
RENDERER = "role_colon"
# Prefer replies made of letters a-m to the others.
PAIRS = [("Write letters.", "abc def", "xyz uvw"), ("Say something.", "bead", "zoo")] * 4


def comparisons(path: Path) -> str:
    with path.open("w") as f:
        for prompt, chosen, rejected in PAIRS:
            comparison = {
                "prompt_conversation": [{"role": "user", "content": prompt}],
                "completion_A": [{"role": "assistant", "content": chosen}],
                "completion_B": [{"role": "assistant", "content": rejected}],
            }
            f.write(json.dumps({"comparison": comparison, "label": "A"}) + "\n")
    return str(path)


def config(log_path: str) -> train_dpo.Config:
    Path(log_path).mkdir(parents=True, exist_ok=True)
    data = comparisons(Path(log_path) / "comparisons.jsonl")
    return train_dpo.Config(
        log_path=log_path,
        recipe_name="dpo_letters",
        model_name=MODEL,
        renderer_name=RENDERER,
        dataset_builder=DPODatasetBuilderFromComparisons(
            comparison_builder=ComparisonBuilderFromJsonl(train_path=data),
            common_config=ChatDatasetBuilderCommonConfig(
                model_name_for_tokenizer=MODEL,
                renderer_name=RENDERER,
                max_length=64,
                batch_size=4,
            ),
        ),
        learning_rate=1e-3,
        lora_rank=4,
        dpo_beta=0.1,
        max_steps=2,
    )


if __name__ == "__main__":
    train_dpo.main(config(sys.argv[1]))
    print("cookbook dpo: done")
