"""A page's elements and text as a browser's parser sees them, for the tests that write markup from outside."""
from __future__ import annotations

from html.parser import HTMLParser


class Elements(HTMLParser):
    """Every element's tag and attributes, and the page's text."""

    def __init__(self, text: str):
        super().__init__()
        self.elements, self.text = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def handlers(self) -> list[tuple[str, str]]:
        """(tag, attribute) of every event handler attribute (onfocus, onerror, ...) and every script element."""
        found = [(tag, name) for tag, attrs in self.elements for name in attrs if name.startswith("on")]
        return found + [(tag, "") for tag, _ in self.elements if tag == "script"]
