"""The MLPerf reference's draw of its users and their conversations (spec.TEMPLATES and the
constants after it), seeded per user and per conversation: the same seed gives the same users
and conversations whatever else the run does. What is drawn, and from what, is the
reference's; its random streams are Python's, so the same seed does not give its same users."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qual.workloads.kvcache.spec import (CONTINUE, DECODE_BATCH, MAX_TURNS, MODELS,
                                         PREFILL_ONLY, QOS_SHARES, SYSTEM_PROMPT_SHARE,
                                         SYSTEM_PROMPT_TOKENS, TEMPLATES, entry_bytes, templates)

_USER, _TURNS = 1, 2  # the streams' names in their seeds


@dataclass(frozen=True)
class User:
    """A user, drawn once: its template, QoS class, and the context length, generation length
    and think time its requests are drawn from."""

    template: str
    qos: str
    context: int
    generation: int
    think: float


@dataclass(frozen=True)
class Turn:
    """One request of a conversation: the tokens of its own new entry, the tokens it
    generates, its user's pause before it, how many times decode reads its entry (0: a
    context of PREFILL_ONLY tokens or more is only prefilled), and the system prompt's tokens
    its context opened with (0: none)."""

    tokens: int
    generated: int
    pause: float
    decode_reads: int
    system_prompt: int = 0


def profile(table: dict, seed: int, user: int) -> User:
    rng = np.random.default_rng([seed, user, _USER])
    name = list(TEMPLATES)[int(rng.integers(len(TEMPLATES)))]
    u, qos, share = float(rng.random()), list(QOS_SHARES)[-1], 0.0
    for cls, p in QOS_SHARES.items():
        share += p
        if u < share:
            qos = cls
            break
    (c_lo, c_hi), (g_lo, g_hi), (t_lo, t_hi) = templates(table)[name]
    return User(name, qos, int(rng.integers(c_lo, c_hi + 1)),
                   int(rng.integers(g_lo, g_hi + 1)), float(rng.uniform(t_lo, t_hi)))


def conversation(user: User, seed: int, number: int, conversation: int) -> list[Turn]:
    """User `number`'s conversation number `conversation`: a first turn, then each next one
    with probability CONTINUE, MAX_TURNS at most."""
    rng = np.random.default_rng([seed, number, conversation, _TURNS])
    turns: list[Turn] = []
    while len(turns) < MAX_TURNS and (not turns or rng.random() < CONTINUE):
        context = int(rng.integers(max(1, user.context // 4), user.context + 1))
        generated = int(rng.integers(max(1, user.generation // 4), user.generation + 1))
        pause = user.think * float(rng.uniform(0.8, 1.2))
        prompt = 0
        if rng.random() < SYSTEM_PROMPT_SHARE:  # its system prompt's tokens are the prefix's
            prompt = SYSTEM_PROMPT_TOKENS[int(rng.integers(len(SYSTEM_PROMPT_TOKENS)))]
        reads = 0 if context >= PREFILL_ONLY else 1 + math.ceil(generated / DECODE_BATCH)
        turns.append(Turn(max(1, context - prompt), generated, pause, reads, prompt))
    return turns


def held_at_once(table: dict, seed: int) -> int:
    """The bytes the store must hold while every user has a request in flight: each user's
    largest entry (its whole context), as this seed draws the users. A store smaller than this
    overwrites entries before their own decode reads them."""
    bpt = MODELS[table["model"]].bytes_per_token
    return sum(entry_bytes(profile(table, seed, u).context, bpt) for u in range(table["users"]))
