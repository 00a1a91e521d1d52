"""The gateway: one front door over a fleet of Hearth nodes and OpenAI-compatible engines
(docs/gateway.md, "Code map"). One folder per question:

    edge/       HTTP in and out; decides nothing, remembers nothing (generate, resources, admin,
                models, forward, delegate, ollama)
    turn/       one generation request, first byte to last: request (read) -> proxy (the attempt
                loop) -> send -> relay (the stream) -> after (what is recorded)
    routing/    which node: affinity keys (the one spelling of a store key), prefixes, the cost model
    fleet/      which nodes exist and how each is: pool (admission), probes, health, digests,
                membership, moves (a session moved with its KV), leases (several gateways)
    upstream/   talking to a node: the fast HTTP client for generation, NodeClient for the rest, headers
    failover/   what happens when a node fails: retry (before the first byte), resume (after it,
                with a protocol's cut: cuts/), restore (a session or chain on another node),
                record (a turn kept from the relay), openai (foreign engines' text continuation)
    foreign/    openai-kind engines behind the node's own protocol layer
    store/      the database: interface, SQLite, PostgreSQL, schema, the Batch API's tables
    batches/    the Batch API's runs: lines through the gateway's own turn path, as flex

and, at the top, settings (the fleet file and flags), state (what routes see), metrics,
protocols (the client protocols' streams as the gateway reads them), tenancy (who owns what),
background (gateway-run background responses) and app (the composition root).

A package imports only from its own floor or below (tests/unit/test_layering.py):
settings, metrics, protocols < routing < store < tenancy, upstream < fleet < failover
< turn, foreign < background, batches < state < edge < app."""
