"""Tic-tac-toe served over HTTP the way the original OpenTinker serves environments.

A FastAPI app under uvicorn: POST /reset starts an episode, POST /step applies the policy's move
and the random opponent's reply. `cargo bench --bench plugin_calls` starts it (when FastAPI is
installed) and times one step over a keep-alive connection, beside the same step of the Wasm
plugin. Run by hand: python3 bench/python/tictactoe_server.py --port 8765
"""

import argparse
import itertools
import random

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]

app = FastAPI()
episodes: dict[int, dict] = {}
ids = itertools.count()


class Reset(BaseModel):
    seed: int = 0


class Step(BaseModel):
    episode_id: int
    action: str


def outcome(board):
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


def render(board):
    return "\n".join(
        "".join(board[r * 3 + c] if board[r * 3 + c] != "." else str(r * 3 + c + 1) for c in range(3))
        for r in range(3)
    )


@app.post("/reset")
def reset(request: Reset):
    episode_id = next(ids)
    board = ["."] * 9
    episodes[episode_id] = {"board": board, "rng": random.Random(request.seed)}
    return {"episode_id": episode_id, "observation": render(board) + "\nYou play X. Your move?"}


@app.post("/step")
def step(request: Step):
    episode = episodes[request.episode_id]
    board, rng = episode["board"], episode["rng"]
    try:
        cell = int(request.action.strip()) - 1
    except ValueError:
        cell = -1
    if not (0 <= cell < 9) or board[cell] != ".":
        del episodes[request.episode_id]
        return {"observation": "not a free cell: you lose", "reward": -1.0, "done": True}
    board[cell] = "X"
    if outcome(board) is None:
        free = [i for i, v in enumerate(board) if v == "."]
        board[rng.choice(free)] = "O"
    result = outcome(board)
    if result is None:
        return {"observation": render(board) + "\nYour move?", "reward": 0.0, "done": False}
    del episodes[request.episode_id]
    reward = {"X": 1.0, "O": -1.0, "draw": 0.0}[result]
    return {"observation": render(board) + f"\nGame over: {result}", "reward": reward, "done": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
