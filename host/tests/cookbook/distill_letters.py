"""The tinker-cookbook's on-policy distillation (tinker_cookbook.distillation.train_on_policy.main),
unmodified, against an `opentinker serve` on loopback: a student (a LoRA on the served tiny
model) samples answers to prompts of our own, given through the cookbook's PromptOnlyDataset; a
teacher (a second tiny model of other weights, served beside it) scores them with
compute_logprobs; the student trains on the reverse KL to it. Both models are served under their
directories' paths, where the cookbook's get_tokenizer reads them: nothing comes from the hub.

Usage: distill_letters.py LOG_DIR
Environment: TINKER_BASE_URL, TINKER_API_KEY, OPENTINKER_MODEL_DIR, OPENTINKER_TEACHER_DIR."""

import asyncio
import os
import sys

import chz
from tinker_cookbook import renderers
from tinker_cookbook.distillation import train_on_policy
from tinker_cookbook.distillation.datasets import (
    DistillationDatasetConfig,
    PromptOnlyDataset,
    TeacherConfig,
)
from tinker_cookbook.rl.types import RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

STUDENT = os.environ["OPENTINKER_MODEL_DIR"]
TEACHER = os.environ["OPENTINKER_TEACHER_DIR"]
RENDERER = "role_colon"
PROMPTS = ["Write letters.", "Name a colour.", "Count to three.", "Say hello."]


@chz.chz
class PromptsBuilder(RLDatasetBuilder):
    async def __call__(self):
        tokenizer = get_tokenizer(STUDENT)
        renderer = renderers.get_renderer(RENDERER, tokenizer=tokenizer)
        prompts = PromptOnlyDataset(
            prompts=PROMPTS,
            batch_size=2,
            group_size=2,
            renderer=renderer,
            tokenizer=tokenizer,
        )
        return prompts, None


def config(log_path: str) -> train_on_policy.Config:
    return train_on_policy.Config(
        learning_rate=1e-3,
        dataset_configs=[
            DistillationDatasetConfig(
                dataset_builder=PromptsBuilder(),
                teacher_config=TeacherConfig(base_model=TEACHER),
                groups_per_batch=2,
            )
        ],
        model_name=STUDENT,
        recipe_name="distill_letters",
        renderer_name=RENDERER,
        max_tokens=8,
        lora_rank=4,
        log_path=log_path,
        max_steps=2,
    )


if __name__ == "__main__":
    asyncio.run(train_on_policy.main(config(sys.argv[1])))
    print("cookbook distillation: done")
