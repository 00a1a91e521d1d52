"""Anthropic's Messages API: requests and routes (`messages`), content blocks and the SSE
stream (`stream`)."""
