"""The built-in benchmark prompt set: a few prompts per category, chosen so that the code
categories show what a code draft model is for and the others show where it is not."""

from __future__ import annotations

CODE_CATEGORIES = ("code-completion", "code-explanation")
CATEGORIES = (*CODE_CATEGORIES, "prose", "json", "grounded")


def code_categories(categories: list[str], builtin: bool) -> list[str]:
    """Which of the prompts' categories the bench sums up as "code": the built-in set's own
    (CODE_CATEGORIES); in a prompts file, every category whose name contains "code" (any
    case), so that "code", "python-code" and "Code review" count."""
    seen = list(dict.fromkeys(categories))
    if builtin:
        return [c for c in seen if c in CODE_CATEGORIES]
    return [c for c in seen if "code" in c.lower()]

_BINARY_SEARCH = '''def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1'''

_LRU = '''class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.data = {}
        self.order = []

    def get(self, key):
        if key not in self.data:
            return -1
        self.order.remove(key)
        self.order.append(key)
        return self.data[key]

    def put(self, key, value):
        if key in self.data:
            self.order.remove(key)
        elif len(self.data) >= self.capacity:
            oldest = self.order.pop(0)
            del self.data[oldest]
        self.data[key] = value
        self.order.append(key)'''

_PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens until it shone, and wound the clockwork that turned the "
    "light. Ships he would never meet passed safely in the dark, and in the morning he wrote "
    "their names, when he could read them, in a leather logbook that had belonged to his "
    "father."
)

# (category, prompt), by category; PROMPTS below takes them round-robin so that a bench cut
# short still covers every category.
_BY_CATEGORY: tuple[tuple[str, str], ...] = (
    ("code-completion", "Write a Python function `merge_sort(xs)` that returns a sorted copy "
     "of a list using merge sort. Only the code, no explanation."),
    ("code-completion", "Complete this Python class so that it implements a stack with push, "
     "pop, peek, is_empty and __len__. Only the code.\n\n```python\nclass Stack:\n"
     "    def __init__(self):\n"),
    ("code-completion", "Write a Python script that reads a CSV file given on the command line "
     "with argparse and prints the sum of each numeric column. Only the code."),
    ("code-explanation", f"Explain step by step what this function does and its time "
     f"complexity:\n\n```python\n{_BINARY_SEARCH}\n```"),
    ("code-explanation", f"Explain how this class works and what is inefficient about "
     f"it:\n\n```python\n{_LRU}\n```"),
    ("prose", "Write a short story about a robot who learns to paint, in about 150 words."),
    ("prose", "Write a friendly email to a colleague suggesting that the team moves its "
     "weekly meeting from Monday to Wednesday, and why."),
    ("json", "Return a JSON object describing three fictional books, each with the keys "
     "title, author, year, genres (a list) and rating (a number). Only the JSON."),
    ("json", "Convert this to a JSON array of objects with keys name, role and start_date "
     "(ISO format). Only the JSON.\n\nAlice Smith, engineer, started 3 March 2021\n"
     "Bob Jones, designer, started 15 July 2019\nCarol White, manager, started 1 Jan 2018\n"
     "Dan Brown, analyst, started 22 October 2022"),
    ("grounded", f"Add type hints and a docstring to this function. Return the whole "
     f"function.\n\n```python\n{_BINARY_SEARCH}\n```"),
    ("grounded", f"Rename the attribute `data` to `store` everywhere in this class and return "
     f"the whole class.\n\n```python\n{_LRU}\n```"),
    ("grounded", f"Repeat this passage, then continue it with one more paragraph in the same "
     f"style.\n\n{_PASSAGE}"),
)


def _round_robin(items: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    groups = [[item for item in items if item[0] == c] for c in CATEGORIES]
    depth = max(map(len, groups))
    return tuple(g[i] for i in range(depth) for g in groups if i < len(g))


PROMPTS = _round_robin(_BY_CATEGORY)
