"""Ollama's native API on the node's port (embeddings are hearth.api.ollama.embed's)."""

from __future__ import annotations

from starlette.routing import Route

from hearth.api.ollama import generate, models, pull


def routes() -> list[Route]:
    return [
        Route("/api/chat", generate.chat, methods=["POST"]),
        Route("/api/generate", generate.generate, methods=["POST"]),
        Route("/api/tags", models.tags, methods=["GET"]),
        Route("/api/show", models.show, methods=["POST"]),
        Route("/api/ps", models.ps, methods=["GET"]),
        Route("/api/version", models.version, methods=["GET"]),
        Route("/api/pull", pull.pull, methods=["POST"]),
        Route("/api/delete", pull.delete, methods=["DELETE"]),
    ]
