"""The Batch API's pieces the node (hearth/api/batches/) and the gateway (hearth/gateway/batches/)
share: the input line format and its checks (lines.py), the requests' checks and the objects
they create (requests.py), and a line as a request an app makes to itself (dispatch.py)."""
