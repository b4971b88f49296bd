#!/usr/bin/env python3
"""Builds the relevance evaluation data from the Python FAQ (Debian package
python3.11-doc, /usr/share/doc/python3.11/html/faq/; text (c) Python Software
Foundation, PSF License Version 2).

Each FAQ entry becomes one resource file OUT/kb/NNN.txt holding the answer
only: the question heading is removed so that a match is not trivial.
OUT/questions.tsv lists "question<TAB>file".

An entry is a leaf <section> of the page's main body (a section with no
sections inside it): the FAQ pages put their questions at <h2> (design,
extending, windows, ...) or at <h3> under <h2> categories (general,
programming, library, ...), and a leaf section is a question either way.
The page title, the category introductions, the local table of contents and
the sidebar are not entries, nor are answers under 40 characters (three
cross-references such as "See the next question.").

    python3 scripts/python_faq_eval.py OUT [FAQ_DIR]
"""
import html.parser
import os
import sys

PAGES = ["general", "programming", "design", "library", "extending", "windows", "gui", "installed"]
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
BREAKS = ("p", "li", "pre", "dt", "dd", "br", "tr", "div")


class Faq(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.entries = []  # (question, answer) of each leaf section, in page order
        self.stack = []  # open sections: {"q": heading text, "a": [answer parts], "leaf": bool}
        self.div_depth = 0  # depth of <div> inside the main body, 0 = outside it
        self.heading = False
        self.skip = 0  # inside a "¶" permalink

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            if self.div_depth:
                self.div_depth += 1
            elif a.get("role") == "main":
                self.div_depth = 1
        if not self.div_depth:
            return
        if tag == "section":
            if self.stack:
                self.stack[-1]["leaf"] = False
            self.stack.append({"q": "", "a": [], "leaf": True})
        elif tag in HEADINGS and self.stack and not self.stack[-1]["q"]:
            self.heading = True
        elif tag == "a" and "headerlink" in (a.get("class") or ""):
            self.skip += 1
        if tag in BREAKS and self.stack:
            self.stack[-1]["a"].append("\n")

    def handle_endtag(self, tag):
        if tag == "div" and self.div_depth:
            self.div_depth -= 1
        if not self.div_depth:
            return
        if tag in HEADINGS:
            self.heading = False
        elif tag == "a" and self.skip:
            self.skip -= 1
        elif tag == "section" and self.stack:
            s = self.stack.pop()
            if s["leaf"]:
                self.entries.append((s["q"], "".join(s["a"])))

    def handle_data(self, data):
        if not self.div_depth or self.skip or not self.stack:
            return
        s = self.stack[-1]
        if self.heading:
            s["q"] += data
        else:
            s["a"].append(data)


def main():
    out = sys.argv[1]
    faq = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/doc/python3.11/html/faq"
    os.makedirs(os.path.join(out, "kb"), exist_ok=True)
    rows = []
    for page in PAGES:
        p = Faq()
        with open(os.path.join(faq, page + ".html"), encoding="utf-8") as f:
            p.feed(f.read())
        for q, a in p.entries:
            q = " ".join(q.split())
            lines = [" ".join(l.split()) for l in a.split("\n")]
            answer = "\n".join(l for l in lines if l)
            if not q or len(answer) < 40:
                continue  # "See the next question." points elsewhere: no passage to find
            name = "%03d.txt" % len(rows)
            with open(os.path.join(out, "kb", name), "w", encoding="utf-8") as f:
                f.write(answer + "\n")
            rows.append((q, name))
    with open(os.path.join(out, "questions.tsv"), "w", encoding="utf-8") as f:
        for q, name in rows:
            f.write("%s\t%s\n" % (q.replace("\t", " "), name))
    print("%d entries from %s into %s" % (len(rows), faq, out))


main()
