"""The built-in chat page: static files served by hearth.api.web."""
