"""Deterministic prompts for the A/B sections: agent-style workloads (a file to rewrite with one
change, a JSON document to echo with edits, code to continue), ordinary chat, and the fixed
prompt set for the KV-type comparison. Every prompt starts with a per-round tag, so no server
can reuse a cached prefix of an earlier round."""

from __future__ import annotations

import json
import random

STORY = (
    "Write a long, detailed story about a lighthouse keeper on a remote island who finds a message "
    "in a bottle. Describe the island, the weather, the keeper's daily routine, and what happens next."
)

_NAMES = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "lambda", "zeta"]


def python_file(lines: int = 150, seed: int = 7) -> str:
    """A plausible Python module of about `lines` lines."""
    rng = random.Random(seed)
    out = ['"""Inventory helpers."""', "", "from __future__ import annotations", "", "import math", ""]
    i = 0
    while len(out) < lines:
        a, b = rng.sample(_NAMES, 2)
        out += [
            f"def {a}_{b}_{i}(items: list[float], limit: int = {rng.randint(2, 99)}) -> float:",
            f'    """Combine the {a} and {b} values of the first `limit` items."""',
            "    total = 0.0",
            "    for k, value in enumerate(items[:limit]):",
            f"        total += value * {rng.randint(2, 9)} if k % 2 else math.sqrt(abs(value))",
            f"    return round(total / max(1, limit), {rng.randint(1, 4)})",
            "",
            "",
        ]
        i += 1
    return "\n".join(out[:lines])


def json_document(items: int = 30, seed: int = 11) -> str:
    rng = random.Random(seed)
    doc = {
        "version": 3,
        "items": [
            {
                "id": k,
                "name": f"{rng.choice(_NAMES)}-{k}",
                "qty": rng.randint(1, 50),
                "status": rng.choice(["open", "pending"]),
                "tags": rng.sample(_NAMES, 2),
            }
            for k in range(items)
        ],
    }
    return json.dumps(doc, indent=2)


def agent_workloads(tag: str) -> dict[str, list[dict[str, str]]]:
    """Messages per workload; the agent has seen the text it will mostly write again."""
    code = python_file()
    return {
        "rewrite_file": [
            {"role": "system", "content": "You are a coding assistant. Answer with the complete file only."},
            {
                "role": "user",
                "content": f"[{tag}] Here is inventory.py:\n```python\n{code}\n```\n"
                "Rewrite the whole file, unchanged except that the first function "
                "returns the total without rounding.",
            },
        ],
        "echo_json": [
            {"role": "system", "content": "You are a JSON API. Answer with JSON only."},
            {
                "role": "user",
                "content": f'[{tag}] Return this document with every "pending" status set to '
                f'"done", everything else unchanged:\n{json_document()}',
            },
        ],
        "continue_code": [
            {
                "role": "user",
                "content": f"[{tag}] Continue this module with more functions in the same style:\n"
                f"```python\n{python_file(220, seed=3)}\n",
            }
        ],
        "chat": [{"role": "user", "content": f"[{tag}] {STORY}"}],
    }


KV_PROMPTS = [
    "Name three primary colors.",
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain what a CPU does in two sentences.",
    "List five fruits.",
    "How many days are in a leap year?",
    "Give me a tip for learning to cook.",
    "What is photosynthesis?",
    "Describe the ocean in one sentence.",
    "Write a short greeting for a birthday card.",
    "Why is the sky blue?",
    "Suggest a name for a cat.",
    "What does a librarian do?",
    "Translate 'good morning' into Spanish.",
    "Tell me a fun fact about owls.",
    "How do I boil an egg?",
]
