#!/usr/bin/env python3
"""Builds the relevance evaluation data from the Python FAQ (Debian package
python3.11-doc, /usr/share/doc/python3.11/html/faq/; text (c) Python Software
Foundation, PSF License Version 2).

Each FAQ entry (an <h3> question with its answer) becomes one resource file
OUT/kb/NNN.txt holding the answer only: the question heading is removed so
that a match is not trivial. OUT/questions.tsv lists "question<TAB>file".

    python3 scripts/python_faq_eval.py OUT [FAQ_DIR]
"""
import html.parser
import os
import sys

PAGES = ["general", "programming", "design", "library", "extending", "windows", "gui", "installed"]


class Faq(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.entries = []  # [question, answer parts]
        self.in_h3 = False
        self.in_body = False
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and a.get("role") == "main":
            self.in_body = True
        if not self.in_body:
            return
        if tag in ("h1", "h2"):
            self.entries.append(None)  # a category heading ends the entry
        if tag == "h3":
            self.in_h3 = True
            self.entries.append(["", []])
        if tag == "a" and "headerlink" in (a.get("class") or ""):
            self.skip += 1
        if tag in ("p", "li", "pre", "dt", "dd", "br") and self.entries and self.entries[-1]:
            self.entries[-1][1].append("\n")

    def handle_endtag(self, tag):
        if tag == "h3":
            self.in_h3 = False
        if tag == "a" and self.skip:
            self.skip -= 1
        if tag == "footer" or (tag == "div" and False):
            self.in_body = False

    def handle_data(self, data):
        if not self.in_body or self.skip:
            return
        cur = self.entries[-1] if self.entries else None
        if cur is None:
            return
        if self.in_h3:
            cur[0] += data
        else:
            cur[1].append(data)


def main():
    out = sys.argv[1]
    faq = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/doc/python3.11/html/faq"
    os.makedirs(os.path.join(out, "kb"), exist_ok=True)
    rows = []
    for page in PAGES:
        p = Faq()
        with open(os.path.join(faq, page + ".html"), encoding="utf-8") as f:
            p.feed(f.read())
        for e in p.entries:
            if not e:
                continue
            q = " ".join(e[0].split())
            lines = [" ".join(l.split()) for l in "".join(e[1]).split("\n")]
            answer = "\n".join(l for l in lines if l)
            if len(q) < 8 or len(answer) < 40:
                continue
            name = "%03d.txt" % len(rows)
            with open(os.path.join(out, "kb", name), "w", encoding="utf-8") as f:
                f.write(answer + "\n")
            rows.append((q, name))
    with open(os.path.join(out, "questions.tsv"), "w", encoding="utf-8") as f:
        for q, name in rows:
            f.write("%s\t%s\n" % (q.replace("\t", " "), name))
    print("%d entries from %s into %s" % (len(rows), faq, out))


main()
