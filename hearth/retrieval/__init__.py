"""Finding what in a set of text files answers a question, for a model to read: the files
(`documents`), cut into chunks of whole lines (`chunks`), ranked against a question by BM25 and
chosen within a token budget (`ranking`), and the messages that carry documents or passages to
the model and cite them after its answer (`prompts`).

No server and no terminal here: `hearth docs` (cli/docs.py) holds the conversation with a server
and the question loop, and calls this package for the rest.
"""
