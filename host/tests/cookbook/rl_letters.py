"""The tinker-cookbook's own RL loop (tinker_cookbook.rl.train.main), unmodified, against an
`opentinker serve` on loopback: an environment written with the cookbook's Env / EnvGroupBuilder /
RLDataset classes, on the served tiny model named by its directory path (which is also where the
cookbook's get_tokenizer finds its tokenizer: nothing comes from the model hub).

Usage: rl_letters.py MODE LOG_DIR   (MODE: see `config`; run again on LOG_DIR to resume)
Environment: TINKER_BASE_URL, TINKER_API_KEY, OPENTINKER_MODEL_DIR."""

import asyncio
import os
import sys
from collections.abc import Sequence

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import (
    Env,
    EnvGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
)
from tinker_cookbook.tokenizer_utils import get_tokenizer

MODEL = os.environ["OPENTINKER_MODEL_DIR"]
RENDERER = "role_colon"
LETTERS = set("abcdefghijklm")


class LettersEnv(Env):
    """One turn: the reward is the fraction of the reply's characters among a-m."""

    def __init__(self, renderer: renderers.Renderer):
        self.renderer = renderer

    async def initial_observation(self):
        prompt = self.renderer.build_generation_prompt(
            [{"role": "user", "content": "Write letters."}]
        )
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None):
        text = self.renderer.tokenizer.decode(action)
        reward = sum(c in LETTERS for c in text) / max(len(text), 1)
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.renderer.get_stop_sequences(),
            metrics={"letters": reward},
        )


class LettersGroup(EnvGroupBuilder):
    async def make_envs(self) -> Sequence[Env]:
        renderer = renderers.get_renderer(RENDERER, get_tokenizer(MODEL))
        return [LettersEnv(renderer) for _ in range(4)]

    def logging_tags(self) -> list[str]:
        return ["letters"]


class LettersDataset(RLDataset):
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [LettersGroup() for _ in range(2)]

    def __len__(self) -> int:
        return 4


@chz.chz
class LettersDatasetBuilder(RLDatasetBuilder):
    async def __call__(self):
        return LettersDataset(), None


def config(mode: str, log_path: str) -> train.Config:
    """`sync`; `async` (its loss is the AsyncConfig default, stable_reinforce); `async-ppo-kl`
    (PPO, with a KL penalty against the base model); `stream` (streaming minibatches)."""
    async_config = stream_config = kl_reference = None
    extra = {}
    if mode == "async":
        async_config = train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=2)
    elif mode == "async-ppo-kl":
        async_config = train.AsyncConfig(
            max_steps_off_policy=1, groups_per_batch=2, loss_fn="ppo"
        )
        kl_reference = train.KLReferenceConfig(base_model=MODEL)
        extra = {"kl_penalty_coef": 0.05, "loss_fn": "ppo"}
    elif mode == "stream":
        stream_config = train.StreamMinibatchConfig(groups_per_batch=2, num_minibatches=2)
    elif mode != "sync":
        raise SystemExit(f"unknown mode {mode!r}")
    return train.Config(
        learning_rate=1e-3,
        dataset_builder=LettersDatasetBuilder(),
        model_name=MODEL,
        renderer_name=RENDERER,
        recipe_name="opentinker_letters",
        max_tokens=8,
        log_path=log_path,
        lora_rank=4,
        eval_every=0,
        save_every=2,
        rolling_save_every=1,
        base_url=os.environ["TINKER_BASE_URL"],
        async_config=async_config,
        stream_minibatch_config=stream_config,
        kl_reference_config=kl_reference,
        **extra,
    )


if __name__ == "__main__":
    mode, log_path = sys.argv[1], sys.argv[2]
    asyncio.run(train.main(config(mode, log_path)))
    print(f"cookbook rl ({mode}): done")
