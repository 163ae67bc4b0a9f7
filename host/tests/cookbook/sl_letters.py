"""The tinker-cookbook's own supervised loop (tinker_cookbook.supervised.train.main), unmodified,
against an `opentinker serve` on loopback: conversations from a JSONL file through the cookbook's
FromConversationFileBuilder, on the served tiny model named by its directory path.

Usage: sl_letters.py LOG_DIR
Environment: TINKER_BASE_URL, TINKER_API_KEY, OPENTINKER_MODEL_DIR."""

import asyncio
import json
import os
import sys
from pathlib import Path

from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

MODEL = os.environ["OPENTINKER_MODEL_DIR"]

log_path = Path(sys.argv[1])
log_path.mkdir(parents=True, exist_ok=True)
conversations = log_path / "conversations.jsonl"
with conversations.open("w") as file:
    for i in range(16):
        messages = [
            {"role": "user", "content": f"Count to {i % 5 + 1}."},
            {"role": "assistant", "content": " ".join(str(n) for n in range(1, i % 5 + 2))},
        ]
        file.write(json.dumps({"messages": messages}) + "\n")

config = train.Config(
    log_path=str(log_path),
    model_name=MODEL,
    renderer_name="role_colon",
    recipe_name="opentinker_counting",
    dataset_builder=FromConversationFileBuilder(
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=MODEL,
            renderer_name="role_colon",
            max_length=64,
            batch_size=4,
        ),
        file_path=str(conversations),
    ),
    learning_rate=1e-3,
    lora_rank=4,
    save_every=2,
    eval_every=0,
    base_url=os.environ["TINKER_BASE_URL"],
)
asyncio.run(train.main(config))
metrics = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
losses = [m["train_mean_nll"] for m in metrics if "train_mean_nll" in m]
assert len(losses) == 4 and losses[-1] < losses[0], metrics
print("cookbook sl: losses", [round(loss, 3) for loss in losses])
