"""Fixed answers for the chat page's rendering tests: every markdown feature, a long answer for the
streaming cost, and hostile markdown/HTML. Fixed text, never the model's: what these tests check
must not depend on what a tiny model happens to write."""

from __future__ import annotations

# Every feature the page renders, once.
FEATURES = """\
# Heading one

## Heading two

A paragraph with **bold**, *italic*, ~~struck~~, `inline code` and a [link](https://example.org/docs "Docs").
An autolink: https://example.com/path.

- first item
- second item with `code`
  - nested item

1. one
2. two

- [x] done task
- [ ] open task

> A quote
> over two lines.

| Name | Score | Note |
|:-----|------:|:----:|
| ada  | 10    | *top* |
| bob  | 7     | ok |

```python
def greet(name: str) -> str:
    return f"Hello, {name}!"
```

```
plain block <not a tag>
```

---

Last line with a footnote-like [ref](http://example.net).
"""

# The structure FEATURES must render to, from `outline()` below (tag, the attributes that matter,
# text; highlight.js spans inside code are folded into their text).
FEATURES_OUTLINE = [
    ["h1", {}, "Heading one"],
    ["h2", {}, "Heading two"],
    ["p", {}, "A paragraph with ", ["strong", {}, "bold"], ", ", ["em", {}, "italic"], ", ", ["del", {}, "struck"],
     ", ", ["code", {}, "inline code"], " and a ",
     ["a", {"href": "https://example.org/docs", "rel": "noopener noreferrer", "target": "_blank", "title": "Docs"},
      "link"],
     ".", ["br", {}], "An autolink: ",
     ["a", {"href": "https://example.com/path", "rel": "noopener noreferrer", "target": "_blank"},
      "https://example.com/path"], "."],
    ["ul", {}, ["li", {}, "first item"],
     ["li", {}, "second item with ", ["code", {}, "code"], ["ul", {}, ["li", {}, "nested item"]]]],
    ["ol", {}, ["li", {}, "one"], ["li", {}, "two"]],
    ["ul", {}, ["li", {}, "☑ done task"], ["li", {}, "☐ open task"]],
    ["blockquote", {}, ["p", {}, "A quote", ["br", {}], "over two lines."]],
    ["div", {"class": "table-wrap"}, ["table", {},
     ["thead", {}, ["tr", {}, ["th", {"align": "left"}, "Name"], ["th", {"align": "right"}, "Score"],
                    ["th", {"align": "center"}, "Note"]]],
     ["tbody", {},
      ["tr", {}, ["td", {"align": "left"}, "ada"], ["td", {"align": "right"}, "10"],
       ["td", {"align": "center"}, ["em", {}, "top"]]],
      ["tr", {}, ["td", {"align": "left"}, "bob"], ["td", {"align": "right"}, "7"],
       ["td", {"align": "center"}, "ok"]]]]],
    ["div", {"class": "codeblock"},
     ["div", {"class": "code-head"}, ["span", {"class": "code-lang"}, "python"],
      ["button", {"class": "copy copy-code", "title": "copy this code"}, "Copy"]],
     ["pre", {"data-lang": "python"}, ["code", {"class": "hljs"},
                                       'def greet(name: str) -> str:\n    return f"Hello, {name}!"']]],
    ["div", {"class": "codeblock"},
     ["div", {"class": "code-head"}, ["span", {"class": "code-lang"}, "text"],
      ["button", {"class": "copy copy-code", "title": "copy this code"}, "Copy"]],
     ["pre", {}, ["code", {}, "plain block <not a tag>"]]],
    ["hr", {}],
    ["p", {}, "Last line with a footnote-like ",
     ["a", {"href": "http://example.net", "rel": "noopener noreferrer", "target": "_blank"}, "ref"], "."],
]

# A JS function: the outline of an element's children (see FEATURES_OUTLINE). Text is joined
# and its whitespace collapsed except inside <pre>, where it is kept as is.
OUTLINE_JS = """(root) => {
  const KEEP = ['href', 'title', 'target', 'rel', 'align', 'data-lang', 'class', 'src', 'alt'];
  function walk(node, pre) {
    const out = [];
    const push = (t) => { if (typeof out[out.length - 1] === 'string') out[out.length - 1] += t; else out.push(t); };
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        push(pre ? child.data : child.data.replace(/\\s+/g, ' '));
      } else if (child.nodeType === Node.ELEMENT_NODE) {
        const tag = child.tagName.toLowerCase();
        if (tag === 'span' && child.closest('code')) { push(child.textContent); continue; }  // highlight.js colours
        const attrs = {};
        for (const a of child.attributes) if (KEEP.includes(a.name)) attrs[a.name] = a.value;
        out.push([tag, attrs, ...walk(child, pre || tag === 'pre')]);
      }
    }
    if (pre) return out;
    if (typeof out[0] === 'string') out[0] = out[0].trimStart();
    if (typeof out[out.length - 1] === 'string') out[out.length - 1] = out[out.length - 1].trimEnd();
    return out.filter((x) => typeof x !== 'string' || x.trim() !== '');
  }
  return walk(root, false);
}"""


def long_answer() -> str:
    """About 2,000 tokens (~8,500 characters) of varied markdown: sections of paragraphs, lists,
    a table and a code block, each a little different."""
    parts = ["# A long answer\n\nThis answer is long on purpose: it is streamed to the page in small pieces.\n"]
    for i in range(1, 19):
        parts.append(f"""
## Part {i}

Paragraph {i} explains a point with **emphasis**, a `call_{i}()` and a [reference](https://example.org/{i}).
It goes on for a second line, so that it is a real paragraph of several sentences, number {i}.

- item {i}.1 with *style*
- item {i}.2
- item {i}.3 ends the list

| key | value |
|-----|------:|
| a{i} | {i * 3} |
| b{i} | {i * 7} |

```python
def part_{i}(x: int) -> int:
    total = 0
    for k in range(x):
        total += k * {i}
    return total
```
""")
    return "".join(parts)


def chunks(text: str, size: int = 4) -> list[str]:
    """The text cut into stream pieces of `size` characters (a token is about four)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


# Hostile answers: each tries to run `PWN(name)` (defined by the test) or to navigate the page.
# Markdown links and images, raw HTML, SVG and MathML tricks, mutation XSS, attribute breakouts.
HOSTILE = {
    "script": "<script>PWN('script')</script> after",
    "img-onerror": '<img src=x onerror="PWN(\'img-onerror\')">',
    "md-link": "[click](javascript:PWN('md-link'))",
    "md-link-case": "[click](JaVaScRiPt:PWN('md-link-case'))",
    "md-link-entity": "[click](&#106;avascript:PWN('md-link-entity'))",
    "md-link-autolink": "<javascript:PWN('md-autolink')>",
    "md-image": "![pic](javascript:PWN('md-image'))",
    "md-title-breakout": "[x](https://example.org \"\\\" onmouseover=\\\"PWN('title')\")",
    "html-link": '<a href="javascript:PWN(\'html-link\')">x</a>',
    "html-link-entity": '<a href="&#x6A;avascript:PWN(\'html-link-entity\')">x</a>',
    "html-link-space": '<a href=" javascript:PWN(\'html-link-space\')">x</a>',
    "data-html-link": '<a href="data:text/html,<script>PWN(1)</script>">data</a>',
    "svg-onload": '<svg onload="PWN(\'svg-onload\')"><circle r="5"/></svg>',
    "svg-script": "<svg><script>PWN('svg-script')</script></svg>",
    "svg-xlink": '<svg><a xlink:href="javascript:PWN(\'svg-xlink\')"><text x="1" y="10">x</text></a></svg>',
    "svg-animate": '<svg><animate onbegin="PWN(\'svg-animate\')" attributeName="x" dur="1s"/></svg>',
    "svg-set-href": ('<svg><a><set attributeName="href" to="javascript:PWN(\'svg-set\')"/>'
                     '<text y="9">x</text></a></svg>'),
    "mxss-math": '<math><mtext><table><mglyph><style><img src=x onerror="PWN(\'mxss\')">',
    "noscript": '<noscript><p title="</noscript><img src=x onerror=PWN(\'noscript\')>">',
    "iframe-srcdoc": "<iframe srcdoc=\"<script>parent.PWN('iframe')</script>\"></iframe>",
    "details-ontoggle": '<details open ontoggle="PWN(\'details\')">x</details>',
    "form-action": '<form action="javascript:PWN(\'form\')"><button>go</button></form>',
    "style-and-hover": '<div style="background:url(javascript:PWN(\'css\'))" onmouseover="PWN(\'hover\')">hover</div>',
    "object": '<object data="javascript:PWN(\'object\')"></object>',
    "embed": '<embed src="javascript:PWN(\'embed\')">',
    "base": '<base href="javascript:PWN(\'base\')//"><a href="x">relative</a>',
    "meta-refresh": '<meta http-equiv="refresh" content="0;url=javascript:PWN(\'meta\')">',
    "autofocus": '<input autofocus onfocus="PWN(\'autofocus\')">',
    "video-source": '<video><source onerror="PWN(\'video\')"></video>',
    "body-onload": "<body onload=PWN('body')>",
    "lookalike-controls": '<button class="copy-code">Copy</button><div class="msg-actions">fake</div>',
    "html-in-code": "```html\n<script>PWN('code')</script>\n```",
    "inline-code": "`<img src=x onerror=PWN('inline')>`",
}
