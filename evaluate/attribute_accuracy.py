"""GenEval-style attribute accuracy: the scene a caption asks for against the scene the shapes scorer reads.

Each image gets a verdict per attribute the caption asks for (`judge`); verdicts are counted by the kind
of caption (`AttributeTally`) into the ``attr_<kind>_<attribute>`` columns. The caption grammar, the
attribute names and the kinds are the shapes domain's (``models.shapes.grammar``); the scorer that reads
an image's scene is ``models.shapes.scorer``.
"""
from __future__ import annotations

from models.shapes import asked_attributes, ATTRIBUTES, KINDS, kinds_of, Scene

PREFIX = "attr_"
VERDICTS = (*ATTRIBUTES, "all")  # per image: each attribute asked for, and all of them right


def attr_column(kind: str, verdict: str) -> str:
    """The results column of one verdict's accuracy over one kind of caption: ``attr_single_color``."""
    return f"{PREFIX}{kind}_{verdict}"


# The stored columns: every verdict of each kind of caption, and all right over every caption.
ATTRIBUTE_COLUMNS = [*(attr_column(kind, v) for kind in KINDS for v in (*asked_attributes(kind), "all")),
                     attr_column("all", "all")]
COUNT_COLUMNS = [f"{PREFIX}n_{kind}" for kind in KINDS]  # images of each kind
# The columns a summary shows (the demo's table): colour, shape, count of one group, position of two, all right.
HEADLINE_COLUMNS = (*(attr_column("single", a) for a in ("color", "shape", "count")), attr_column("pair", "position"),
                    attr_column("object", "all"), attr_column("all", "all"))


def judge(asked: Scene, seen: Scene) -> dict[str, bool | None]:
    """GenEval-style verdicts for one image: each attribute of the caption right or not.

    colour / shape / count: every group asked for is there with that attribute. For two groups the
    generated groups are matched to the asked ones in whichever order agrees on more colours and shapes,
    so a scene with the groups swapped still counts its colours right. Count also needs the right number
    of groups. position: two groups, laid out on the asked axis, with the asked order (``None`` for a
    one-group caption). ``all``: all of these right.
    """
    n = len(asked.groups)
    if len(seen.groups) != n:  # wrong number of groups: attributes compared on what overlaps
        pairs = list(zip(asked.groups, seen.groups))
        order_ok = False
    else:
        straight = list(zip(asked.groups, seen.groups))
        if n == 2:
            swapped = list(zip(asked.groups, reversed(seen.groups)))
            agree = lambda ps: sum((a.color == s.color) + (a.shape == s.shape) for a, s in ps)  # noqa: E731
            order_ok = agree(straight) >= agree(swapped)
            pairs = straight if order_ok else swapped
        else:
            pairs, order_ok = straight, True
    full = len(pairs) == n
    out: dict[str, bool | None] = {
        "color": full and all(a.color == s.color for a, s in pairs),
        "shape": full and all(a.shape == s.shape for a, s in pairs),
        "count": len(seen.groups) == n and all(a.count == s.count for a, s in pairs),
        "position": (seen.layout == asked.layout and order_ok) if n == 2 else None,
    }
    out["all"] = all(v for v in out.values() if v is not None)
    return out


def attribute_values(asked: Scene, verdict: dict[str, bool | None]) -> dict[str, float]:
    """The tally keys one image counts in (``single_color``, ``pair_position``, ``all_all``, ...): 1.0 when
    that attribute is right, 0.0 when wrong; attributes without a verdict are left out."""
    return {f"{kind}_{k}": float(v) for k, v in verdict.items() if v is not None for kind in (*kinds_of(asked), "all")}


class AttributeTally:
    """Running GenEval-style accuracies over images, by the kind of caption (``models.shapes.KINDS``).

    ``single``: one group ("three red circles"); ``object``: the one-group captions that ask for one
    shape ("a red circle"), a subset of ``single``; ``pair``: two groups and their relation; ``all``:
    every caption.
    """

    def __init__(self):
        self.counts: dict[str, list[int]] = {}

    def add(self, asked: Scene, verdict: dict[str, bool | None]) -> None:
        for key, right in attribute_values(asked, verdict).items():
            c = self.counts.setdefault(key, [0, 0])
            c[0] += int(right)
            c[1] += 1

    def merge(self, counts: dict[str, list[int]]) -> None:
        for k, (right, n) in counts.items():
            c = self.counts.setdefault(k, [0, 0])
            c[0] += right
            c[1] += n

    def summary(self) -> dict[str, float]:
        """``attr_object_color`` ... ``attr_all_all``: fraction right; ``attr_n_object``, ``attr_n_single``,
        ``attr_n_pair``: images."""
        out = {f"{PREFIX}{k}": round(right / n, 4) for k, (right, n) in sorted(self.counts.items()) if n}
        for kind in KINDS:
            out[f"{PREFIX}n_{kind}"] = self.counts.get(f"{kind}_all", [0, 0])[1]
        return out


