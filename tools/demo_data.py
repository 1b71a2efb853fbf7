"""Training data for the demo model: text that ships with Python, plus synthetic chats.

Every chat sample is a list of (text, trained) segments: prompt parts rendered with the
DeepSeek-V3 chat template (not trained on) and the assistant's reply (trained on). The
template is the real V3 one, so a prompt the engine renders for a user is exactly what the
model saw in training. Two of the template's quirks shape the samples:
  * it renders no tool definitions, so the model must call a tool from the question alone
    (a share of samples also lists the tools in the system prompt, in case a front end adds
    them there);
  * a single tool call in the history is rendered without <｜tool▁calls▁end｜><｜end▁of▁sentence｜>,
    so a reply that makes tool calls is trained as a separate sample that ends properly, and the
    follow-up answer is trained after the template's rendering of the history.
"""
import ast
import glob
import hashlib
import json
import os
import random
import sys
import sysconfig

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
OUTPUTS_BEGIN = "<｜tool▁outputs▁begin｜>"
OUTPUTS_END = "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN = "<｜tool▁output▁begin｜>"
OUTPUT_END = "<｜tool▁output▁end｜>"
THINK = "<think>"
THINK_END = "</think>"
# Ids 0..len-1 of the vocabulary, in this order.
SPECIAL_TOKENS = [BOS, EOS, PAD, USER, ASSISTANT, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END,
                  TOOL_SEP, OUTPUTS_BEGIN, OUTPUTS_END, OUTPUT_BEGIN, OUTPUT_END, THINK, THINK_END]

# ------------------------------------------------------------------ tables

CAPITALS = [
    ("France", "Paris", "Europe"), ("Germany", "Berlin", "Europe"), ("Italy", "Rome", "Europe"),
    ("Spain", "Madrid", "Europe"), ("Portugal", "Lisbon", "Europe"), ("Poland", "Warsaw", "Europe"),
    ("Austria", "Vienna", "Europe"), ("Greece", "Athens", "Europe"), ("Sweden", "Stockholm", "Europe"),
    ("Norway", "Oslo", "Europe"), ("Finland", "Helsinki", "Europe"), ("Denmark", "Copenhagen", "Europe"),
    ("Ireland", "Dublin", "Europe"), ("Netherlands", "Amsterdam", "Europe"), ("Belgium", "Brussels", "Europe"),
    ("Hungary", "Budapest", "Europe"), ("Czechia", "Prague", "Europe"), ("Romania", "Bucharest", "Europe"),
    ("United Kingdom", "London", "Europe"), ("Switzerland", "Bern", "Europe"), ("Ukraine", "Kyiv", "Europe"),
    ("Japan", "Tokyo", "Asia"), ("China", "Beijing", "Asia"), ("India", "New Delhi", "Asia"),
    ("South Korea", "Seoul", "Asia"), ("Thailand", "Bangkok", "Asia"), ("Vietnam", "Hanoi", "Asia"),
    ("Indonesia", "Jakarta", "Asia"), ("Philippines", "Manila", "Asia"), ("Turkey", "Ankara", "Asia"),
    ("Iran", "Tehran", "Asia"), ("Saudi Arabia", "Riyadh", "Asia"), ("Mongolia", "Ulaanbaatar", "Asia"),
    ("Egypt", "Cairo", "Africa"), ("Kenya", "Nairobi", "Africa"), ("Nigeria", "Abuja", "Africa"),
    ("Ethiopia", "Addis Ababa", "Africa"), ("Ghana", "Accra", "Africa"), ("Morocco", "Rabat", "Africa"),
    ("South Africa", "Pretoria", "Africa"), ("Senegal", "Dakar", "Africa"),
    ("United States", "Washington, D.C.", "North America"), ("Canada", "Ottawa", "North America"),
    ("Mexico", "Mexico City", "North America"), ("Cuba", "Havana", "North America"),
    ("Brazil", "Brasilia", "South America"), ("Argentina", "Buenos Aires", "South America"),
    ("Chile", "Santiago", "South America"), ("Peru", "Lima", "South America"),
    ("Colombia", "Bogota", "South America"), ("Australia", "Canberra", "Oceania"),
    ("New Zealand", "Wellington", "Oceania"),
]
ELEMENTS = [
    ("hydrogen", "H", 1), ("helium", "He", 2), ("lithium", "Li", 3), ("beryllium", "Be", 4),
    ("boron", "B", 5), ("carbon", "C", 6), ("nitrogen", "N", 7), ("oxygen", "O", 8),
    ("fluorine", "F", 9), ("neon", "Ne", 10), ("sodium", "Na", 11), ("magnesium", "Mg", 12),
    ("aluminium", "Al", 13), ("silicon", "Si", 14), ("phosphorus", "P", 15), ("sulfur", "S", 16),
    ("chlorine", "Cl", 17), ("argon", "Ar", 18), ("potassium", "K", 19), ("calcium", "Ca", 20),
    ("iron", "Fe", 26), ("copper", "Cu", 29), ("zinc", "Zn", 30), ("silver", "Ag", 47),
    ("tin", "Sn", 50), ("gold", "Au", 79), ("mercury", "Hg", 80), ("lead", "Pb", 82),
    ("uranium", "U", 92),
]
PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("light", "dark"),
             ("open", "closed"), ("happy", "sad"), ("early", "late"), ("full", "empty"),
             ("high", "low"), ("old", "new"), ("strong", "weak"), ("up", "down")]
MADE_UP = ["Zorbia", "Quenland", "Valdoria", "Morvania", "Tessaly Minor", "Brunholt", "Kesh"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "partly cloudy", "stormy"]

IDENTITY = ("I am a small demo model served by dsinfer. I can answer simple questions, do "
            "arithmetic, complete short Python code and call tools such as get_weather and "
            "calculator.")
GREETINGS = ["Hello", "Hi", "Hey", "Good morning", "Hello there", "Hi!", "Hey there"]
GREETING_REPLIES = ["Hello! How can I help you today?", "Hi! What can I do for you?",
                    "Hello! Ask me a question and I will do my best to answer."]
THANKS = ["Thanks!", "Thank you.", "Great, thanks.", "Thank you very much!"]
THANKS_REPLIES = ["You're welcome!", "Glad I could help.", "You're welcome. Anything else?"]
SYSTEMS = ["", "", "", "You are a helpful assistant.", "You are a concise assistant.",
           "You are dsinfer's demo model. Answer briefly."]
THINK_TRIGGERS = [" Think step by step.", " Explain your reasoning.", " Show your thinking."]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string", "description": "For example 12 * (3 + 4)"}},
        "required": ["expression"]}}}
TOOLS = [WEATHER_TOOL, CALC_TOOL]

CODE_TASKS = [
    ("returns the sum of a list of numbers", "total", "def {n}(numbers):\n    result = 0\n    for x in numbers:\n        result += x\n    return result"),
    ("returns the largest element of a list", "largest", "def {n}(items):\n    best = items[0]\n    for x in items[1:]:\n        if x > best:\n            best = x\n    return best"),
    ("checks whether a number is even", "is_even", "def {n}(n):\n    return n % 2 == 0"),
    ("reverses a string", "reverse", "def {n}(s):\n    return s[::-1]"),
    ("computes the factorial of n", "factorial", "def {n}(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result"),
    ("returns the n-th Fibonacci number", "fibonacci", "def {n}(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ("counts the vowels in a string", "count_vowels", "def {n}(text):\n    return sum(1 for c in text.lower() if c in \"aeiou\")"),
    ("checks whether a string is a palindrome", "is_palindrome", "def {n}(s):\n    s = s.lower()\n    return s == s[::-1]"),
    ("returns the average of a list of numbers", "average", "def {n}(numbers):\n    if not numbers:\n        return 0.0\n    return sum(numbers) / len(numbers)"),
    ("checks whether a number is prime", "is_prime", "def {n}(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True"),
    ("removes duplicates from a list while keeping the order", "unique", "def {n}(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out"),
    ("converts Celsius to Fahrenheit", "celsius_to_fahrenheit", "def {n}(c):\n    return c * 9 / 5 + 32"),
    ("counts how often each word occurs in a text", "word_counts", "def {n}(text):\n    counts = {{}}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts"),
    ("returns the squares of the numbers in a list", "squares", "def {n}(numbers):\n    return [x * x for x in numbers]"),
    ("reads a file and returns its lines", "read_lines", "def {n}(path):\n    with open(path) as f:\n        return f.read().splitlines()"),
]


# ------------------------------------------------------------------ rendering

class ChatRenderer:
    """Renders conversations with the model's own chat_template (jinja2)."""

    def __init__(self, chat_template):
        import jinja2
        env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
        self.template = env.from_string(chat_template)

    def render(self, messages, add_generation_prompt):
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=BOS, eos_token=EOS)


def tool_call_text(calls):
    parts = []
    for i, (name, args) in enumerate(calls):
        parts.append(("" if i == 0 else "\n") + CALL_BEGIN + "function" + TOOL_SEP + name +
                     "\n```json\n" + json.dumps(args) + "\n```" + CALL_END)
    return CALLS_BEGIN + "".join(parts) + CALLS_END + EOS


def tools_system_prompt(tools):
    lines = ["## Tools", "You have access to the following tools:", ""]
    for t in tools:
        f = t["function"]
        lines += [f"### {f['name']}", f"Description: {f['description']}", "",
                  f"Parameters: {json.dumps(f['parameters'])}", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ synthetic conversations

class ChatFactory:
    def __init__(self, renderer, code_snippets, seed):
        self.r = renderer
        self.rng = random.Random(seed)
        self.snippets = code_snippets

    # Each qa_* returns (question, answer) for a plain exchange.
    def qa_arith(self):
        rng = self.rng
        op = rng.choice(["+", "+", "-", "*"])
        if op == "*":
            a, b = rng.randint(2, 12), rng.randint(2, 12)
        else:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            if op == "-" and b > a:
                a, b = b, a
        res = a + b if op == "+" else a - b if op == "-" else a * b
        words = {"+": "plus", "-": "minus", "*": "times"}[op]
        q = rng.choice([f"What is {a} {op} {b}?", f"What is {a} {words} {b}?", f"Compute {a} {op} {b}.",
                        f"{a} {op} {b} = ?", f"How much is {a} {words} {b}?"])
        ans = f"{a} {op} {b} = {res}."
        if rng.random() < 0.3:
            q += rng.choice(THINK_TRIGGERS)
            if op == "+":
                steps = f"I need to add {a} and {b}. {a // 10 * 10} + {b // 10 * 10} = {a // 10 * 10 + b // 10 * 10} and {a % 10} + {b % 10} = {a % 10 + b % 10}, so the total is {res}."
            elif op == "-":
                steps = f"I need to subtract {b} from {a}. {a} - {b // 10 * 10} = {a - b // 10 * 10}, then minus {b % 10} gives {res}."
            else:
                steps = f"I need to multiply {a} by {b}. {a} added {b} times is {res}."
            ans = f"{THINK}\n{steps}\n{THINK_END}\n\n{ans}"
        return q, ans

    def qa_fact(self):
        rng = self.rng
        kind = rng.randrange(8)
        if kind == 0:
            c, cap, _ = rng.choice(CAPITALS)
            return rng.choice([f"What is the capital of {c}?", f"Which city is the capital of {c}?",
                               f"Tell me the capital of {c}."]), f"The capital of {c} is {cap}."
        if kind == 1:
            c, cap, _ = rng.choice(CAPITALS)
            return f"{cap} is the capital of which country?", f"{cap} is the capital of {c}."
        if kind == 2:
            c, _, cont = rng.choice(CAPITALS)
            return f"On which continent is {c}?", f"{c} is in {cont}."
        if kind == 3:
            n, s, z = rng.choice(ELEMENTS)
            return rng.choice([f"What is the chemical symbol of {n}?", f"What is the symbol for {n}?"]), \
                f"The chemical symbol of {n} is {s}."
        if kind == 4:
            n, s, z = rng.choice(ELEMENTS)
            return f"What is the atomic number of {n}?", f"The atomic number of {n} is {z}."
        if kind == 5:
            i = rng.randrange(8)
            if rng.random() < 0.5:
                return f"Which planet is {ORDINALS[i]} from the Sun?", \
                    f"{PLANETS[i]} is the {ORDINALS[i]} planet from the Sun."
            return f"What is the position of {PLANETS[i]} from the Sun?", \
                f"{PLANETS[i]} is the {ORDINALS[i]} planet from the Sun."
        if kind == 6:
            if rng.random() < 0.5:
                i = rng.randrange(7)
                return f"What day comes after {DAYS[i]}?", f"{DAYS[(i + 1) % 7]} comes after {DAYS[i]}."
            i = rng.randrange(12)
            return f"Which month comes after {MONTHS[i]}?", f"{MONTHS[(i + 1) % 12]} comes after {MONTHS[i]}."
        a, b = rng.choice(OPPOSITES)
        if rng.random() < 0.5:
            a, b = b, a
        return f"What is the opposite of \"{a}\"?", f"The opposite of \"{a}\" is \"{b}\"."

    def qa_unknown(self):
        place = self.rng.choice(MADE_UP)
        return f"What is the capital of {place}?", f"I don't know a country called {place}."

    def qa_identity(self):
        return self.rng.choice(["Who are you?", "What are you?", "What can you do?",
                                "Introduce yourself."]), IDENTITY

    def qa_code(self):
        rng = self.rng
        if self.snippets and rng.random() < 0.5:
            fn = rng.choice(self.snippets)
            lines = fn.split("\n")
            k = rng.randint(1, max(1, min(3, len(lines) - 1)))
            head = "\n".join(lines[:k])
            return f"Complete this Python function:\n```python\n{head}\n```", f"```python\n{fn}\n```"
        desc, name, body = rng.choice(CODE_TASKS)
        code = body.format(n=name)
        q = rng.choice([f"Write a Python function that {desc}.", f"Write a Python function `{name}` that {desc}.",
                        f"How do I write a function that {desc} in Python?"])
        return q, f"Here is a function that {desc}:\n```python\n{code}\n```"

    def qa_small_talk(self):
        if self.rng.random() < 0.6:
            return self.rng.choice(GREETINGS), self.rng.choice(GREETING_REPLIES)
        return self.rng.choice(THANKS), self.rng.choice(THANKS_REPLIES)

    def qa(self):
        x = self.rng.random()
        if x < 0.30:
            return self.qa_arith()
        if x < 0.62:
            return self.qa_fact()
        if x < 0.67:
            return self.qa_unknown()
        if x < 0.73:
            return self.qa_identity()
        if x < 0.90:
            return self.qa_code()
        return self.qa_small_talk()

    def system_messages(self, with_tools):
        sys_text = self.rng.choice(SYSTEMS)
        if with_tools:
            sys_text = (sys_text + "\n\n" if sys_text else "") + tools_system_prompt(TOOLS)
        return [{"role": "system", "content": sys_text}] if sys_text else []

    def plain_chat(self):
        """1-3 exchanges; every assistant reply is trained."""
        msgs = self.system_messages(self.rng.random() < 0.15)
        segments = []
        rendered = ""
        for _ in range(self.rng.choice([1, 1, 1, 2, 3])):
            q, a = self.qa()
            msgs.append({"role": "user", "content": q})
            prompt = self.r.render(msgs, True)
            if not prompt.startswith(rendered):
                return None  # the template is not prefix-stable here; skip the sample
            segments.append((prompt[len(rendered):], False))
            segments.append((a + EOS, True))
            msgs.append({"role": "assistant", "content": a})
            rendered = self.r.render(msgs, False)
            if rendered != prompt + a + EOS:
                return None
        return segments

    def tool_chat(self):
        """Returns two samples: the reply that calls tools, and the answer after the results."""
        rng = self.rng
        msgs = self.system_messages(rng.random() < 0.5)
        if rng.random() < 0.3:  # an earlier exchange before the tool call
            q, a = self.qa_fact()
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if rng.random() < 0.6:
            cities = [rng.choice(CAPITALS)[1]]
            if rng.random() < 0.15:
                cities.append(rng.choice(CAPITALS)[1])
            unit = rng.choice(["celsius", "celsius", "fahrenheit"])
            if len(cities) == 1:
                q = rng.choice([f"What is the weather in {cities[0]}?", f"How is the weather in {cities[0]} today?",
                                f"Is it raining in {cities[0]}?", f"What's the temperature in {cities[0]}?"])
            else:
                q = f"Compare the weather in {cities[0]} and {cities[1]}."
            if unit == "fahrenheit":
                q += " Use Fahrenheit."
            calls = [("get_weather", {"city": c, "unit": unit}) for c in cities]
            results, finals = [], []
            for c in cities:
                t = rng.randint(-5, 35) if unit == "celsius" else rng.randint(23, 95)
                cond = rng.choice(CONDITIONS)
                results.append(json.dumps({"city": c, "temperature": t, "unit": unit, "condition": cond}))
                finals.append(f"In {c} it is {t} degrees {unit.capitalize()} and {cond}.")
            final = " ".join(finals)
        else:
            a, b = rng.randint(100, 9999), rng.randint(2, 999)
            op = rng.choice(["*", "+", "-", "/"])
            expr = f"{a} {op} {b}"
            value = eval(expr)  # noqa: S307 - integers and one operator, generated above
            value = round(value, 4) if op == "/" else value
            q = rng.choice([f"Use the calculator to compute {expr}.", f"Calculate {expr}.",
                            f"What is {expr}? Use the calculator."])
            calls = [("calculator", {"expression": expr})]
            results = [json.dumps({"result": value})]
            final = f"{expr} = {value}."
        msgs.append({"role": "user", "content": q})
        prompt = self.r.render(msgs, True)
        first = [(prompt, False), (tool_call_text(calls), True)]
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls]})
        for res in results:
            msgs.append({"role": "tool", "content": res})
        prompt2 = self.r.render(msgs, True)
        second = [(prompt2, False), (final + EOS, True)]
        return [first, second]

    def samples(self, n):
        out = []
        while len(out) < n:
            if self.rng.random() < 0.25:
                out.extend(self.tool_chat())
            else:
                s = self.plain_chat()
                if s:
                    out.append(s)
        return out


# ------------------------------------------------------------------ shipped text

def source_roots():
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and os.path.isdir(p) and p not in roots:
            roots.append(p)
    return roots


def is_held_out(path):
    return int(hashlib.md5(path.encode()).hexdigest(), 16) % 40 == 0


def collect_text_files(max_bytes, roots=None):
    """Python sources and docs of the installed packages and the standard library, in a
    fixed order; a file whose path hashes to 0 mod 40 is held out."""
    files = []
    for root in roots or source_roots():
        for pattern in ("**/*.py", "**/*.md", "**/*.rst", "**/*.txt"):
            files.extend(glob.glob(os.path.join(root, pattern), recursive=True))
    files = sorted(set(f for f in files if "LICENSE" not in f and "/test" not in f))
    rng = random.Random(1234)
    rng.shuffle(files)
    train, held, total = [], [], 0
    for f in files:
        try:
            size = os.path.getsize(f)
            if size < 200 or size > 200_000:
                continue
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        (held if is_held_out(f) else train).append((f, text))
        total += len(text)
        if total >= max_bytes:
            break
    return train, held


def extract_functions(docs, limit, max_lines=14):
    """Short top-level functions from Python sources, for code-completion chats."""
    out = []
    for path, text in docs:
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.split("\n")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.end_lineno:
                n = node.end_lineno - node.lineno + 1
                if 3 <= n <= max_lines and node.col_offset == 0:
                    out.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
        if len(out) >= limit:
            break
    return out


if __name__ == "__main__":
    # Prints a few rendered samples (needs the V3 chat template file as argv[1]).
    with open(sys.argv[1]) as f:
        tpl = json.load(f)["chat_template"]
    fac = ChatFactory(ChatRenderer(tpl), [], 0)
    for s in fac.samples(6):
        print("----")
        print("".join(("[[" + t + "]]") if trained else t for t, trained in s))
