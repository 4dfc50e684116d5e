#!/usr/bin/env python3
"""Checks every link and anchor of the book (docs/, as docs/SUMMARY.md lists it) and of
README.md against the files and the built book.

A relative link must name a file or folder of the repository; a link with `#anchor` to a
Markdown page must name an id of that page: for a page of the book, an id of the HTML page
mdBook built from it (target/book/PAGE.html, so the check sees exactly what a reader's
browser will), for any other Markdown file the id GitHub's renderer gives the heading
(lower case, punctuation dropped, spaces as hyphens, repeats numbered). Links inside code
blocks and code spans are text, not links. Exits 1 naming every broken link with its file
and line.

Usage: scripts/book-check.py [BOOK_HTML_DIR]   (default target/book)
"""
import html.parser
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DOCS = os.path.join(ROOT, "docs")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def book_pages():
    pages = []
    for line in open(os.path.join(DOCS, "SUMMARY.md"), encoding="utf-8"):
        for target in re.findall(r"\]\(([^)]+\.md)\)", line):
            pages.append(os.path.normpath(os.path.join(DOCS, target)))
    return pages


def slug_ids(path):
    """GitHub's heading ids of a Markdown file (mdBook's normalize_id is the same rule)."""
    ids, seen = set(), {}
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"<[^>]+>", "", m.group(2))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = "".join(
            c.lower() if (c.isalnum() or c in "-_") else ("-" if c.isspace() else "")
            for c in text
        )
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


class Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("id", "name") and v:
                self.ids.add(v)


def html_ids(book, page):
    rel = os.path.relpath(page, DOCS)
    path = os.path.join(book, os.path.splitext(rel)[0] + ".html")
    if not os.path.exists(path):
        return None
    p = Ids()
    p.feed(open(path, encoding="utf-8").read())
    return p.ids


def links(path):
    """(line number, target) of every link outside code."""
    in_code = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"(`+).*?\1", "", line)
        for m in LINK.finditer(line):
            yield no, m.group(1)


def main():
    book = os.path.join(ROOT, sys.argv[1] if len(sys.argv) > 1 else "target/book")
    pages = book_pages()
    missing = [p for p in pages if not os.path.exists(p)]
    errors = [f"docs/SUMMARY.md: {os.path.relpath(p, ROOT)} does not exist" for p in missing]
    id_cache = {}

    def ids_of(target):
        if target not in id_cache:
            ids = html_ids(book, target) if target in pages else None
            id_cache[target] = ids if ids is not None else slug_ids(target)
        return id_cache[target]

    checked = 0
    for src in [os.path.join(ROOT, "README.md")] + [p for p in pages if p not in missing]:
        for no, target in links(src):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            checked += 1
            where = f"{os.path.relpath(src, ROOT)}:{no}"
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(src), file)) if file else src
            if not os.path.exists(dest):
                errors.append(f"{where}: {target}: no such file {os.path.relpath(dest, ROOT)}")
                continue
            if anchor and dest.endswith(".md") and anchor not in ids_of(dest):
                errors.append(f"{where}: {target}: {os.path.relpath(dest, ROOT)} has no heading with id '{anchor}'")
    for e in errors:
        print(f"book-check: {e}", file=sys.stderr)
    print(f"book-check: {checked} links in {len(pages) + 1} pages, {len(errors)} broken")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
