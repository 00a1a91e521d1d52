"""The chat page's files as the app serves them: the allow-list in hearth/api/web.py is exactly
what index.html loads, each file is served with its type, and the vendored libraries are the
bytes hearth/web/vendor/VERSIONS.md records (an edit to one, or an update without the record,
fails here)."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

from hearth.api import web
from tests.api.conftest import Harness


def package_file(name: str) -> bytes:
    return resources.files("hearth.web").joinpath(*name.split("/")).read_bytes()


async def test_the_allow_list_is_what_the_page_loads(h: Harness) -> None:
    page = (await h.client.get("/")).text
    loaded = set(re.findall(r'(?:src|href)="/web/([^"]+)"', page))
    assert loaded == set(web.FILES) - {"index.html"}
    for name, media_type in web.FILES.items():
        r = await h.client.get(f"/web/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == media_type
        assert r.content == package_file(name)
    for name in ("vendor/VERSIONS.md", "vendor/LICENSE.marked", "vendor", "vendor/%2e%2e/app.js",
                 "vendor/..%2Fapp.js", "render.js/x"):
        assert (await h.client.get(f"/web/{name}")).status_code == 404, name


def test_vendored_files_match_their_record() -> None:
    record = package_file("vendor/VERSIONS.md").decode()
    listed = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", record, re.M))
    vendored = {name.removeprefix("vendor/") for name in web.FILES if name.startswith("vendor/")}
    assert set(listed) == vendored
    for name, digest in listed.items():
        assert hashlib.sha256(package_file("vendor/" + name)).hexdigest() == digest, name
    for licence in ("LICENSE.marked", "LICENSE.dompurify", "LICENSE.highlightjs"):
        assert package_file("vendor/" + licence), licence
