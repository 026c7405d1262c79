"""The built-in benchmark prompt set: a few prompts per category, chosen so that the code
categories show what a code draft model is for and the others show where it is not. The
summarization and retrieval-augmented (rag) prompts carry 500-700-token contexts with short
answers: where a draft model's reading of the prompt costs most."""

from __future__ import annotations

CODE_CATEGORIES = ("code-completion", "code-explanation")
CATEGORIES = (*CODE_CATEGORIES, "prose", "json", "grounded", "summarization", "rag")


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

_ARTICLE_WATER = """\
Harrowgate's new water plant opens after four years of delays

HARROWGATE - The town's long-awaited water treatment plant on Mill Lane began supplying \
homes on Monday, ending a four-year saga of budget overruns, a lawsuit over the building \
contract and two summers of boil-water notices that residents say they will not miss.

The plant replaces a filtration works built in 1962 that could no longer keep up with the \
town's growth. Harrowgate's population has risen from about 18,000 to nearly 26,000 since \
2010, most of it in the housing estates on the eastern ridge, and the old works was \
running at more than 95 percent of its capacity on hot days. In July two years ago a pump \
failure left the eastern estates without water pressure for most of a weekend, and tests \
afterwards found bacteria in two of the reservoirs that feed them.

The new plant can treat 14 million litres a day, roughly twice the old works, and uses \
membrane filtration followed by ultraviolet disinfection instead of relying on chlorine \
alone. Chlorine is still added before the water enters the pipes, but at about half the \
previous dose, which the utility says should end the complaints about taste that have \
filled the council's inbox for years.

The project was first approved in 2019 with a budget of 31 million pounds. It finished at \
47 million. Most of the increase, according to an audit published in March, came from \
three sources: steel and concrete prices that rose sharply after the contract was signed, \
a redesign of the intake after engineers found the river bed was softer than the original \
survey said, and eleven months lost to the dispute with the first building contractor, \
Carrick and Bell, which the council dismissed in 2021. That dispute was settled out of \
court last autumn; the terms were not published, but the audit records a payment of \
2.3 million pounds to the contractor.

Council leader Priya Osei said the town had learned hard lessons. "We set a budget before \
we had a proper survey of the site, and we signed a fixed-price contract that was never \
going to survive the market we were in," she told a meeting on Thursday. "The next big \
project will not go to tender until the ground has been surveyed and the risks are priced \
in." The council has since created a capital projects board with two independent \
engineers among its members.

Not everyone is celebrating. Water bills in Harrowgate will rise by 9 percent from April to \
pay for the borrowing, on top of a 6 percent rise last year. The Harrowgate Tenants' \
Association says that households on the lowest incomes will struggle, and has asked the \
utility to extend its discount scheme, which currently covers about 1,400 homes. The \
utility says it is considering the request and will publish a decision in the summer.

The old works on Station Road will be kept running at low volume until the end of the year \
as a backup, then decommissioned. The council has not decided what to do with the site; \
options under discussion include housing, a depot for the bus company and a small park \
along the river."""

_REPORT_OUTAGE = """\
Incident report: checkout failures on 14 May

Summary of impact. Between 09:12 and 10:47 UTC on 14 May, about 38 percent of checkout \
attempts in the web shop failed with an error page. The mobile apps were affected for the \
same period, with a lower failure rate of about 21 percent because they retry payment \
requests once on their own. In total roughly 6,100 orders could not be placed. Customers \
who retried later mostly succeeded: by the end of the day, order volume was 4 percent \
below the same weekday of the previous week, which is within normal variation.

Timeline. At 08:55 the platform team deployed version 3.18 of the payments service. The \
release contained a change to how the service reuses connections to the card processor: \
instead of opening a new connection for every request, it kept a pool of up to 20 open \
connections per instance. The change had been tested in the staging environment for a \
week without problems. At 09:12 the error rate on the checkout endpoint rose above 5 \
percent and the on-call engineer was paged. She first suspected the card processor, \
whose status page showed a minor incident in another region, and spent about 25 minutes \
in contact with their support line before ruling it out. At 09:41 a second engineer \
noticed that the errors were all timeouts and that they came only from instances that had \
been running for more than ten minutes. At 10:20 the team rolled back to version 3.17. The \
error rate returned to normal by 10:47, once all instances had been replaced.

Root cause. The card processor closes connections that have been idle for 60 seconds, \
without notifying the client. The new connection pool did not check whether a connection \
was still alive before reusing it. During quiet moments some pooled connections sat idle \
for more than a minute; the next request sent on such a connection waited for a reply \
that never came, until the service's own timeout of 30 seconds ended it. In staging the \
service receives a steady stream of synthetic test traffic, so no connection was ever idle \
long enough to be closed, and the problem could not appear there.

Why detection took 29 minutes after the page. The dashboard for the payments service shows \
the error rate for all instances together, and the runbook's first step for checkout \
errors is to check the card processor. Neither pointed at the deployment. The deployment \
itself was not announced in the incident channel, because the release tool only posts to \
the team's own channel.

What we are changing. First, the connection pool will validate connections that have been \
idle for more than 30 seconds and close connections older than five minutes; this fix is \
written and is being reviewed. Second, staging will be allowed to go quiet: the synthetic \
traffic will run in bursts with pauses of several minutes, so that idle-time problems can \
show up before production. Third, the release tool will post every production deployment \
to the incident channel, and the checkout runbook will start with the question of what \
changed in the last hour. Fourth, the dashboard will gain a view of errors by instance \
age. We expect the first three changes to be complete within two weeks."""

_DOCS_TIDEWATER = """\
[1] tidewater sync - copies files between a local folder and a bucket. Usage: \
`tidewater sync SOURCE DEST [options]`. Only files whose size or modification time differ \
are copied. Use `--dry-run` to print what would be copied without copying anything. \
`--delete` removes files in DEST that are not in SOURCE; it is off by default and cannot be \
combined with `--dry-run=false` in a config file, only on the command line.

[2] Configuration file. tidewater reads `tidewater.toml` from the current folder, then \
`~/.config/tidewater/config.toml`. Settings on the command line override both. The \
`[network]` table holds connection settings: `timeout` (seconds to wait for a response \
from the server, default 20), `retries` (how many times a failed request is repeated, \
default 3) and `proxy` (an HTTP proxy URL, default none). The `[transfer]` table holds \
`parallel` (files copied at once, default 4) and `chunk_size` (in megabytes, default 8).

[3] Retries and backoff. When a request fails with a network error or a 5xx status, \
tidewater waits before trying again. By default the wait is fixed at 2 seconds. Setting \
`backoff = "exponential"` in the `[network]` table doubles the wait after each failed \
attempt, starting from `backoff_base` seconds (default 1) and never exceeding \
`backoff_max` seconds (default 60). Requests that fail with a 4xx status are never \
retried, because repeating them would fail the same way. Each retry is logged at the \
warning level with the attempt number and the wait.

[4] Release notes, version 2.4. The `--bandwidth` option limits the transfer rate, for \
example `--bandwidth 5M` for five megabytes per second. The default `timeout` was raised \
from 10 to 20 seconds, because users on slow links reported spurious failures. The \
`retry` key, which was deprecated in version 2.0, has been removed: use `retries`.

[5] Troubleshooting. If transfers stop with "connection reset by peer", first check \
whether a proxy or firewall closes idle connections; lowering `parallel` often helps. If \
every request fails at once, check the credentials with `tidewater whoami`. Log files are \
written to `~/.cache/tidewater/logs/`, one per day, and kept for 14 days."""

_DOCS_RAILWAY = """\
Document 1 (Lowmoor Heritage Society, "The Lowmoor Branch Line"): The branch line from \
Kestrel Junction to Lowmoor was opened in 1871 by the Lowmoor and District Railway \
Company, which had been formed six years earlier by a group of quarry owners. Its main \
purpose was to carry slate from the quarries above the town to the main line; passenger \
trains were added in 1874, after the town petitioned for them. The line was 11 miles \
long, with intermediate stations at Brackley Halt and Fenwick.

Document 2 (County Record Office, catalogue note): The company's minute books from 1865 \
to 1923 survive and are held at the Record Office. They record that the company was \
absorbed into the Great Western and Northern Railway in 1923, as part of the grouping of \
the railways. The minute book for 1890 describes a flood that washed away the embankment \
near Fenwick in February of that year, closing the line for seven weeks.

Document 3 (newspaper article, 1962): "Last train to Lowmoor. Crowds gathered on Saturday \
to see the final passenger train leave Lowmoor station, ninety years after the first. \
Passenger numbers have fallen steadily since the bus service to Kestrel began in 1931, and \
the railway says the line now loses money on every journey. Goods trains carrying slate \
will continue to run for the time being."

Document 4 (Lowmoor Heritage Society, "The line today"): Goods traffic ended in 1969 when \
the last quarry closed, and the track was lifted two years later. Since 1998 the society \
has restored a mile and a half of the line from Lowmoor to Brackley Halt, where a \
steam locomotive built in 1907 runs on summer weekends. The society hopes to reach \
Fenwick, but the old embankment there has partly collapsed and would need rebuilding.

Document 5 (guidebook entry): Lowmoor is a small market town known for its slate-roofed \
houses and its Thursday market, which has been held since 1604. The town museum, in the \
former station building, has displays on quarrying and on the railway. Visitors can \
reach the town by bus from Kestrel, which has trains to the city every hour; the journey \
takes about forty minutes, and the bus stops outside the old station."""

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
    ("summarization", f"Summarize this news article in three sentences.\n\n{_ARTICLE_WATER}"),
    ("summarization", f"Summarize this incident report for a manager who has two minutes: what "
     f"happened, why, and what will change.\n\n{_REPORT_OUTAGE}"),
    ("rag", f"Answer the question using only the numbered documents below, and cite them like "
     f"[2].\n\n{_DOCS_TIDEWATER}\n\nQuestion: how do I make tidewater wait longer between "
     f"retries after each failure, and how long does it wait for the server by default?"),
    ("rag", f"Use the documents below to answer the question. If they do not say, answer that "
     f"they do not.\n\n{_DOCS_RAILWAY}\n\nQuestion: when did passenger trains stop running to "
     f"Lowmoor, and why? Can you still ride a train on the old line today?"),
)


def _round_robin(items: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    groups = [[item for item in items if item[0] == c] for c in CATEGORIES]
    depth = max(map(len, groups))
    return tuple(g[i] for i in range(depth) for g in groups if i < len(g))


PROMPTS = _round_robin(_BY_CATEGORY)
