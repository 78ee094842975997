#!/usr/bin/env python3
"""Build the shipped prompt set: data/prompts/train.jsonl and data/prompts/eval.jsonl.

Every prompt here was written for eagle3lab by its developers: hand-written prompts, plus
prompts built from hand-written task templates x hand-written topic lists. Nothing is copied
from a public data set.

Deterministic: a fixed seed and the standard library only, so running this twice writes
byte-identical files.

    python3 data/prompts/build_prompts.py            # writes train.jsonl and eval.jsonl
    python3 data/prompts/build_prompts.py --check    # only verifies the files on disk match

Split rule: prompts are grouped by (category, length); within each group a seeded shuffle
puts round(15%) of the prompts (at least one) into eval.jsonl and the rest into train.jsonl.
eval.jsonl is a held-out set and must never be used for training.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

SEED = 20250611
EVAL_FRACTION = 0.15
LONG_MIN_WORDS = 25  # prompts with at least this many words are "long", the rest "short"
CATEGORIES = ("coding", "math", "writing", "explanation", "chat", "reasoning")
HERE = Path(__file__).resolve().parent

rng = random.Random(SEED)


def fill(templates, topics, per_template):
    """Pair every template with `per_template` topics.

    Topics are shuffled once and dealt out in turn; every topic is used at most once, so two
    prompts never share a topic (and near-copies cannot land on both sides of the split).
    """
    if per_template * len(templates) > len(topics):
        raise SystemExit(f"not enough topics ({len(topics)}) for {len(templates)} templates "
                         f"x {per_template}: {templates[0]!r}")
    topics = list(topics)
    rng.shuffle(topics)
    out, i = [], 0
    for tpl in templates:
        for _ in range(per_template):
            t = topics[i]
            i += 1
            if isinstance(t, tuple):
                out.append(tpl.format(*t))
            else:
                out.append(tpl.format(t=t))
    return out


def draw(plan):
    """Call each number-filling generator in `plan` ((generator, count) pairs) `count` times,
    redrawing any prompt that was already drawn."""
    out, seen = [], set()
    for gen, count in plan:
        for _ in range(count):
            for _attempt in range(50):
                text = gen()
                if text not in seen:
                    break
            else:
                raise SystemExit(f"{gen.__name__}: cannot draw a new prompt")
            seen.add(text)
            out.append(text)
    return out


# ---------------------------------------------------------------------------------------
# coding
# ---------------------------------------------------------------------------------------

CODE_FUNC_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "counts the vowels in a sentence",
    "returns the largest of three numbers",
    "removes duplicates from a list while keeping the original order",
    "converts a temperature from Celsius to Fahrenheit",
    "checks if a word is a palindrome",
    "computes the factorial of a number",
    "returns the n-th Fibonacci number",
    "merges two sorted lists into one sorted list",
    "flattens a list of lists into a single list",
    "counts how many times each word appears in a text",
    "finds the second largest number in a list",
    "capitalizes the first letter of every word in a sentence",
    "checks whether two strings are anagrams of each other",
    "adds up the digits of a positive integer",
    "returns only the even numbers from a list",
    "computes the average of a list of numbers",
    "splits a list into chunks of a given size",
    "finds the longest word in a sentence",
    "rotates a list to the right by k positions",
    "computes the greatest common divisor of two numbers",
    "converts a binary string such as '1011' into an integer",
    "returns the number of days between two dates",
    "checks whether a string contains only digits",
    "removes all spaces from a string",
    "finds the smallest and largest value in a list in one pass",
    "returns a list of the squares of the numbers from 1 to n",
    "counts how many uppercase letters a string has",
    "turns a sentence into title case but leaves short words like 'of' and 'the' lowercase",
]

CODE_FUNC_TEMPLATES = [
    "Write a Python function that {t}.",
    "How do I write a Python function that {t}?",
    "Show me a short Python function that {t}, with a comment on each line.",
    "Write a Python function that {t}. Include two example calls and what they return.",
    "I'm just starting to learn Python and functions still confuse me a little. Could you "
    "write a simple function that {t} and then explain in plain words how it works?",
    "Write a JavaScript function that {t}.",
    "Can you write a JavaScript function that {t} and show how to call it?",
    "Write a Python function that {t}, then tell me its time complexity.",
]

CODE_SQL_TASKS = [
    "lists every customer who lives in Canada",
    "finds the five most expensive products",
    "counts how many employees work in each department",
    "shows all orders placed in the last 30 days",
    "finds students whose grade is above the class average",
    "returns the names of customers who have never placed an order",
    "finds duplicate email addresses in a users table",
    "calculates the total sales for each month",
    "lists the three departments with the highest average salary",
]

CODE_SQL_TEMPLATES = [
    "Write a SQL query that {t}.",
    "How would you write a SQL query that {t}? Please explain each clause briefly.",
    "I'm learning SQL for my new job and I want to understand it, not just copy it. "
    "Write a query that {t}, and describe the table columns you are assuming.",
]

CODE_ORDERS_TASKS = [
    "returns the total revenue for each product",
    "finds all orders placed in March 2024",
    "shows the five largest orders by quantity times price",
    "counts how many orders each customer has made",
    "finds customers who have placed more than three orders",
    "returns the average order value per customer",
]

CODE_ORDERS_TEMPLATES = [
    "Given a table orders(id, customer_name, product, quantity, price, order_date), "
    "write a SQL query that {t}.",
    "I have a SQL table called orders with the columns id, customer_name, product, quantity, "
    "price and order_date. What query {t}?",
]

CODE_SHELL_TASKS = [
    "counts the lines in a text file",
    "finds all .txt files in the current folder and its subfolders",
    "shows how much disk space each folder uses",
    "lists the files in a folder sorted by size",
    "replaces the word 'foo' with 'bar' in a file",
    "shows the last 20 lines of a log file and keeps following it",
    "searches for the word 'error' in every .log file",
    "creates a compressed tar archive of a folder",
    "shows which process is using port 8080",
    "renames every .jpeg file in a folder to .jpg",
    "prints the ten most common words in a text file",
    "copies a folder and everything inside it",
]

CODE_SHELL_TEMPLATES = [
    "Which Linux command {t}?",
    "How can I write a bash one-liner that {t}?",
    "What terminal command {t}? Please explain each part of it.",
]

CODE_CONCEPTS = [
    "a list comprehension",
    "a decorator",
    "a generator",
    "a lambda function",
    "an f-string",
    "a virtual environment",
    "a try/except block",
    "a class",
    "a dictionary",
    "a set",
    "the *args and **kwargs syntax",
    "the with statement",
    "slicing",
    "a module",
]

CODE_CONCEPT_TEMPLATES = [
    "Explain what {t} is in Python, with a tiny example.",
    "In Python, what is {t} and when is it useful?",
    "Can you give me a simple example of {t} in Python and walk me through it?",
]

CODE_DIFFS = [
    ("a list", "a tuple", "Python"),
    ("==", "is", "Python"),
    ("append", "extend", "Python lists"),
    ("let", "const", "JavaScript"),
    ("==", "===", "JavaScript"),
    ("null", "undefined", "JavaScript"),
    ("WHERE", "HAVING", "SQL"),
    ("INNER JOIN", "LEFT JOIN", "SQL"),
    ("git merge", "git rebase", "Git"),
    ("a process", "a thread", "operating systems"),
    ("a stack", "a queue", "data structures"),
    ("return", "print", "Python functions"),
]

CODE_DIFF_TEMPLATES = [
    "What is the difference between {0} and {1} in {2}?",
    "In {2}, when should I use {0} instead of {1}?",
]

CODE_ALGOS = [
    "binary search",
    "bubble sort",
    "insertion sort",
    "merge sort",
    "breadth-first search on a graph",
    "depth-first search on a graph",
    "the two-pointer technique",
    "selection sort",
    "the sieve of Eratosthenes",
    "quicksort",
]

CODE_ALGO_TEMPLATES = [
    "Explain how {t} works, then write it in Python.",
    "Describe {t} step by step in plain English, without code.",
    "What is {t}, and what is a real situation where I would use it?",
]

CODE_HAND = [
    # short
    "How do I reverse a list in Python?",
    "What does `git pull` do?",
    "How do I undo my last git commit but keep the changes?",
    "What is JSON?",
    "Print hello world in JavaScript.",
    "How do I check which version of Python is installed?",
    "What does HTTP status code 404 mean?",
    "Is Python case sensitive?",
    "How do I write a comment in SQL?",
    "What is recursion? Give a tiny example.",
    "Write a for loop in Python that prints the numbers 1 to 10.",
    "How do I make a new folder from the terminal?",
    "What does pip install do?",
    "What is an infinite loop?",
    "How do I get the length of a string in JavaScript?",
    "Write FizzBuzz in Python.",
    "What is Big O notation? Keep it short.",
    "How do I swap two variables in Python?",
    "Why does 0.1 + 0.2 == 0.3 return False in Python?",
    "What is an API?",
    "What is a pull request?",
    "How do I read a text file line by line in Python?",
    "What is the difference between a compiler and an interpreter?",
    "How do I convert a string to a number in JavaScript?",
    "What does the SQL keyword DISTINCT do?",
    "Explain what a Python dictionary is in two sentences.",
    "What does `chmod +x script.sh` do?",
    "How do I get the current date and time in Python?",
    # long: bug fixing, explaining code, small programs with context
    "This Python function is supposed to return the average of a list, but it crashes when "
    "the list is empty. How can I fix it?\n\ndef average(nums):\n    return sum(nums) / len(nums)",
    "Why does this code print 4 five times instead of 0, 1, 2, 3, 4?\n\nfuncs = []\n"
    "for i in range(5):\n    funcs.append(lambda: i)\nfor f in funcs:\n    print(f())",
    "Find the bug in this function. It should count how many times a letter appears in a "
    "word.\n\ndef count_letter(word, letter):\n    count = 0\n    for ch in word:\n"
    "        if ch == letter:\n            count = 1\n    return count",
    "This loop is meant to count down from 10 to 1, but it never stops. What is wrong?\n\n"
    "n = 10\nwhile n > 0:\n    print(n)\n    n + 1",
    "This JavaScript function should add up the numbers in an array, but it returns NaN. "
    "Why?\n\nfunction total(arr) {\n  let sum;\n  for (const x of arr) {\n    sum += x;\n  }\n"
    "  return sum;\n}",
    "This SQL query gives me an error. What is wrong with it, and how do I fix it?\n\n"
    "SELECT department, COUNT(*)\nFROM employees\nWHERE COUNT(*) > 5\nGROUP BY department;",
    "This function should return the last element of a list, but it raises an IndexError. "
    "Fix it.\n\ndef last(items):\n    return items[len(items)]",
    "Why does the second call print ['a', 'b'] instead of just ['b']?\n\n"
    "def add_item(item, items=[]):\n    items.append(item)\n    return items\n\n"
    "print(add_item('a'))\nprint(add_item('b'))",
    "I wrote this to add two numbers that the user types in, but when I enter 2 and 3 it "
    "prints 23. Why, and how do I fix it?\n\na = input('First number: ')\n"
    "b = input('Second number: ')\nprint(a + b)",
    "Explain what this Python code does, line by line:\n\nwords = ['apple', 'kiwi', 'banana']\n"
    "lengths = {w: len(w) for w in words}\nprint(max(lengths, key=lengths.get))",
    "What does this shell command do? I found it in an old cleanup script and I'm afraid to "
    "run it without understanding it.\n\nfind . -name '*.log' -mtime +7 -delete",
    "Explain what this JavaScript code prints and why:\n\nconst nums = [1, 2, 3, 4];\n"
    "const result = nums.filter(n => n % 2 === 0).map(n => n * 10);\nconsole.log(result);",
    "Can you explain this SQL query in plain English?\n\nSELECT c.name, SUM(o.total) AS spent\n"
    "FROM customers c\nJOIN orders o ON o.customer_id = c.id\nGROUP BY c.name\n"
    "ORDER BY spent DESC\nLIMIT 3;",
    "What will this Python code print, and why does changing y also change x?\n\n"
    "x = [1, 2, 3]\ny = x\ny.append(4)\nprint(x)",
    "Rewrite this Python loop as a list comprehension and tell me whether it is faster:\n\n"
    "squares = []\nfor n in range(10):\n    if n % 2 == 0:\n        squares.append(n * n)",
    "Make this function easier to read without changing what it does, and suggest a better "
    "name for it:\n\ndef f(a):\n    r = []\n    for i in range(len(a)):\n        if a[i] > 0:\n"
    "            r.append(a[i])\n    return r",
    "I have a CSV file called sales.csv with the columns date, product and amount. Write a "
    "short Python script using only the standard library that prints the total amount for "
    "each product, sorted from highest to lowest.",
    "I'm building a small to-do list web page. When the user clicks the Add button, the text "
    "from an input box should appear as a new item in a list. Can you write the JavaScript "
    "for that, assuming the input has the id 'task' and the list has the id 'tasks'?",
    "This Python code should print each line of a file, but it prints an empty line between "
    "them. What should I change?\n\nwith open('notes.txt') as f:\n    for line in f:\n"
    "        print(line)",
    "This bash script should greet every name I pass to it, like ./greet.sh Ann Bob, but it "
    "only prints 'Hello, ' once. What is wrong?\n\n#!/bin/bash\nfor name in $names; do\n"
    "  echo \"Hello, $name\"\ndone",
    "Creating Dog('Rex') with this class raises a TypeError. What did I forget?\n\n"
    "class Dog:\n    def __init__(name):\n        self.name = name",
    "Write a Python function is_leap_year(year) that follows the real calendar rules: a year "
    "is a leap year if it is divisible by 4, except years divisible by 100, unless they are "
    "also divisible by 400. Include a few test calls.",
    "I have a list of dictionaries like [{'name': 'Ana', 'age': 31}, {'name': 'Bo', 'age': "
    "25}, {'name': 'Cy', 'age': 40}]. How do I sort it by age in Python, youngest first?",
    "My team wants to store newsletter signups in a database. Each signup has an email "
    "address, a display name and the date the person joined. Write a CREATE TABLE statement "
    "for this and briefly explain the column types you chose.",
    "Explain what this regular expression matches, with two examples that match and one "
    "that does not: ^\\d{3}-\\d{4}$",
    "This JavaScript logs undefined instead of the user's name. Why does this happen?\n\n"
    "const user = { name: 'Lia', greet: function () { console.log(this.name); } };\n"
    "const greet = user.greet;\ngreet();",
    "I'm writing a small Python script that asks the user for their age. If they type "
    "something that is not a number, the script crashes with a ValueError. How can I keep "
    "asking until they enter a valid whole number?",
    "Here is a Python function that checks if a number is even. Is there anything wrong "
    "with it, and can it be shorter?\n\ndef is_even(n):\n    if n % 2 == 0:\n"
    "        return True\n    else:\n        return False",
    "What is the output of this code, and why?\n\nfor i in range(3):\n    for j in range(2):\n"
    "        print(i, j)",
    "This SQL query returns every row instead of only the customers from Paris or Lyon who "
    "are active. What is the bug?\n\nSELECT * FROM customers\n"
    "WHERE city = 'Paris' OR city = 'Lyon' AND active = 1;",
    "I have two lists in Python: names = ['Ana', 'Ben', 'Cleo'] and scores = [88, 92, 75]. "
    "How can I print each name next to its score, and then print the name of the person "
    "with the highest score?",
    "Write a small Python program for a number guessing game: the computer picks a random "
    "number from 1 to 50, the player guesses, and the program says 'higher' or 'lower' "
    "until the guess is right, then prints how many tries it took.",
    "In JavaScript, what is the difference between these two lines, and which one should I "
    "use?\n\nconst copy1 = original;\nconst copy2 = [...original];",
    "My Python program reads a big log file and I only need the lines that contain the word "
    "WARNING. Write a function that takes a file path and returns those lines as a list, "
    "without loading the whole file into memory at once.",
    "This Python function should return True if any number in the list is negative, but it "
    "only ever checks the first number. What is wrong?\n\ndef has_negative(nums):\n"
    "    for n in nums:\n        if n < 0:\n            return True\n        else:\n"
    "            return False",
    "I keep getting 'IndentationError: unexpected indent' in this Python code and I can't see "
    "why. What does the error mean and how do I fix it?\n\ndef greet(name):\n"
    "    message = 'Hi ' + name\n      print(message)",
    "My website shows a list of products, and I want a search box that hides every product "
    "whose name does not contain the typed text. The products are <li> elements inside a "
    "<ul id=\"products\">. Write the JavaScript for this and keep it short.",
    "I have a folder full of photos named like IMG_0001.jpg, IMG_0002.jpg and so on. Write a "
    "short Python script that renames them to holiday_001.jpg, holiday_002.jpg, keeping the "
    "same order, and explain how to test it safely first.",
    "Explain what happens, step by step, when this Python code runs, and what it prints:\n\n"
    "def mystery(n):\n    if n == 0:\n        return 0\n    return n + mystery(n - 1)\n\n"
    "print(mystery(4))",
    "My SQL query is very slow on a table with two million rows. It looks like this:\n\n"
    "SELECT * FROM events WHERE user_id = 42 ORDER BY created_at DESC;\n\n"
    "What could make it faster? Please explain indexes in simple terms.",
]


def build_coding():
    p = []
    p += fill(CODE_FUNC_TEMPLATES, CODE_FUNC_TASKS, 3)
    p += fill(CODE_SQL_TEMPLATES, CODE_SQL_TASKS, 3)
    p += fill(CODE_ORDERS_TEMPLATES, CODE_ORDERS_TASKS, 3)
    p += fill(CODE_SHELL_TEMPLATES, CODE_SHELL_TASKS, 3)
    p += fill(CODE_CONCEPT_TEMPLATES, CODE_CONCEPTS, 3)
    p += fill(CODE_DIFF_TEMPLATES, CODE_DIFFS, 4)
    p += fill(CODE_ALGO_TEMPLATES, CODE_ALGOS, 3)
    p += CODE_HAND
    return p


# ---------------------------------------------------------------------------------------
# math
# ---------------------------------------------------------------------------------------

NAMES = [
    "Maya", "Leo", "Priya", "Omar", "Sofia", "Jonas", "Aisha", "Ben", "Chen", "Elena",
    "Tom", "Zara", "Lucas", "Nina", "Raj", "Hana", "Diego", "Grace", "Sam", "Ivy",
]


def _name():
    return rng.choice(NAMES)


def _two_names():
    a, b = rng.sample(NAMES, 2)
    return a, b


def m_shopping():
    n, k, p, q = _name(), rng.randint(3, 9), rng.randint(2, 6), rng.choice([1.5, 2.25, 3.75])
    item = rng.choice(["notebooks", "apples", "candles", "comic books", "packs of pencils"])
    return f"{n} buys {k} {item} at ${p} each and a pen for ${q:.2f}. How much does {n} spend in total?"


def m_change():
    n = _name()
    bill = rng.choice([20, 50, 100])
    a, b = rng.randint(300, 900) / 100, rng.randint(200, 1200) / 100
    return (f"{n} pays with a ${bill} bill for a sandwich that costs ${a:.2f} and a book that "
            f"costs ${b:.2f}. How much change should {n} get back?")


def m_sharing():
    n, m = _name(), rng.randint(3, 8)
    total = m * rng.randint(4, 15)
    thing = rng.choice(["stickers", "cookies", "marbles", "trading cards", "strawberries"])
    return (f"{n} has {total} {thing} and wants to share them equally among {m} friends. "
            f"How many does each friend get?")


def m_speed():
    h = rng.randint(2, 6)
    d = h * rng.choice([45, 60, 72, 80, 95])
    vehicle = rng.choice(["A train", "A bus", "A car", "A ferry"])
    return f"{vehicle} travels {d} km in {h} hours. What is its average speed?"


def m_travel_time():
    v = rng.choice([12, 15, 18, 20, 24])
    d = v * rng.choice([2, 3, 4]) + v // 2
    return (f"If a cyclist rides at a steady {v} km/h, how long will it take to ride {d} km? "
            f"Give the answer in hours and minutes.")


def m_discount():
    p = rng.choice([40, 60, 75, 80, 120, 150])
    pct = rng.choice([10, 15, 20, 25, 30])
    item = rng.choice(["jacket", "pair of shoes", "backpack", "lamp", "bicycle helmet"])
    return f"A {item} costs ${p}. It is on sale for {pct}% off. What is the sale price?"


def m_percent_of():
    pct = rng.choice([12, 15, 35, 40, 65, 8])
    n = rng.choice([80, 120, 250, 400, 360, 75])
    return f"What is {pct}% of {n}? Show how you worked it out."


def m_average():
    n = _name()
    scores = [rng.randint(60, 99) for _ in range(rng.choice([4, 5]))]
    return (f"{n}'s test scores this term were {', '.join(map(str, scores[:-1]))} and "
            f"{scores[-1]}. What is the average score?")


def m_linear():
    x, a = rng.randint(2, 12), rng.randint(2, 9)
    b = rng.randint(1, 20)
    return f"Solve for x: {a}x + {b} = {a * x + b}."


def m_linear2():
    a, b = rng.randint(2, 6), rng.randint(1, 9)
    x = b + rng.randint(1, 10)
    return f"Solve {a}(x - {b}) = {a * (x - b)} and explain each step."


def m_system():
    y = rng.randint(1, 15)
    x = y + rng.randint(1, 12)
    return f"Find x and y if x + y = {x + y} and x - y = {x - y}."


def m_think_number():
    x, a, b = rng.randint(3, 20), rng.randint(2, 6), rng.randint(1, 15)
    return (f"I'm thinking of a number. If I multiply it by {a} and then add {b}, I get "
            f"{a * x + b}. What is my number?")


def m_ages():
    a, b = _two_names()
    young, k = rng.randint(6, 30), rng.randint(2, 9)
    return (f"{a} is {k} years older than {b}. Together their ages add up to "
            f"{2 * young + k}. How old is each of them?")


def m_dice():
    s = rng.choice([4, 5, 6, 7, 8, 9, 10, 11])
    return f"If you roll two fair six-sided dice, what is the probability that the numbers add up to {s}?"


def m_coins():
    k = rng.randint(2, 5)
    what = rng.choice(["heads every time", "at least one tails", "tails every time"])
    return f"If you flip a fair coin {k} times, what is the probability of getting {what}?"


def m_marbles():
    r, b, g = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 6)
    color = rng.choice(["red", "blue", "green", "not green"])
    return (f"A bag has {r} red, {b} blue and {g} green marbles. If you pick one at random, "
            f"what is the probability that it is {color}?")


def m_marbles2():
    r, b = rng.randint(3, 7), rng.randint(2, 6)
    return (f"A box holds {r} red and {b} blue pens. You take out two pens without looking "
            f"and without putting the first one back. What is the probability that both are red?")


UNITS = [
    ("kilometers", "miles", [5, 10, 42, 100]),
    ("miles", "kilometers", [3, 26, 60]),
    ("pounds", "kilograms", [10, 150, 2.5]),
    ("kilograms", "pounds", [4, 70, 0.5]),
    ("inches", "centimeters", [12, 30, 6]),
    ("feet", "meters", [6, 100, 5280]),
    ("liters", "gallons", [4, 20, 50]),
    ("cups", "milliliters", [2, 3, 0.5]),
    ("hours", "seconds", [2, 3.5, 24]),
    ("days", "minutes", [1, 3, 7]),
    ("square meters", "square feet", [10, 25, 80]),
]


_UNIT_DEAL = []  # (from, to, value) combinations, dealt without repeats


def m_units():
    if not _UNIT_DEAL:
        _UNIT_DEAL.extend((a, b, v) for a, b, vals in UNITS for v in vals)
        rng.shuffle(_UNIT_DEAL)
    a, b, v = _UNIT_DEAL.pop()
    tpl = rng.choice(["How many {b} are in {v} {a}?", "Convert {v} {a} to {b}.",
                      "Roughly how many {b} is {v} {a}?"])
    return tpl.format(a=a, b=b, v=v)


def m_temperature():
    if rng.random() < 0.5:
        return f"Convert {rng.choice([-10, 0, 18, 25, 37, 100])} degrees Celsius to Fahrenheit."
    return f"What is {rng.choice([32, 50, 68, 86, 212, 98.6])} degrees Fahrenheit in Celsius?"


def m_rectangle():
    l = rng.randint(8, 30)
    w = rng.randint(3, l - 2)
    place = rng.choice(["garden", "room", "playground", "parking lot", "rug"])
    return f"A rectangular {place} is {l} m long and {w} m wide. What are its area and perimeter?"


def m_circle():
    r = rng.randint(2, 12)
    return f"What is the area of a circle with a radius of {r} cm? Use 3.14 for pi."


def m_interest():
    p = rng.choice([500, 1000, 1200, 2500, 4000])
    r, t = rng.choice([2, 3, 4, 5]), rng.randint(2, 6)
    return (f"If you put ${p} in a savings account that pays {r}% simple interest per year, "
            f"how much interest will you have earned after {t} years?")


def m_recipe():
    k, m = rng.choice([(4, 6), (2, 5), (6, 9), (4, 10), (3, 8)])
    g = rng.choice([200, 300, 240, 450])
    ing = rng.choice(["flour", "sugar", "rice", "pasta"])
    return (f"A recipe for {k} people uses {g} grams of {ing}. How much {ing} do you need "
            f"to make it for {m} people?")


def m_work_rate():
    a, b = rng.choice([(2, 3), (3, 6), (4, 12), (5, 20), (6, 3)])
    return (f"One hose can fill a pool in {a} hours and a second hose can fill it in {b} hours. "
            f"If both hoses run together, how long will it take to fill the pool?")


def m_fractions():
    b, d = rng.choice([3, 4, 5, 6]), rng.choice([2, 3, 8, 10])
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)  # proper fractions
    op = rng.choice(["+", "-", "x"])
    return f"What is {a}/{b} {op} {c}/{d}? Give the answer as a simplified fraction."


def m_wages():
    n = _name()
    w, h, k = rng.choice([12, 15, 16.5, 18, 22]), rng.randint(10, 30), rng.randint(2, 6)
    w = f"{w:.2f}" if w != int(w) else str(w)
    return (f"{n} earns ${w} per hour and works {h} hours a week. How much does {n} earn "
            f"in {k} weeks?")


def m_pct_increase():
    a = rng.choice([2000, 4000, 5000, 12000, 800])
    p = rng.choice([5, 10, 12, 20, 25])
    what = rng.choice(["A town's population", "The price of a concert ticket",
                       "The number of members in a club", "A company's monthly sales"])
    b = a * (100 + p) // 100
    return f"{what} went from {a} to {b}. What was the percentage increase?"


def m_ratio():
    a, b = rng.choice([(2, 3), (3, 4), (1, 2), (4, 5), (3, 2)])
    total = (a + b) * rng.randint(3, 7)
    return (f"The ratio of boys to girls in a class is {a}:{b}. If there are {total} students "
            f"in total, how many are girls?")


def m_clock():
    h, mnt = rng.randint(1, 9), rng.choice([10, 15, 30, 45, 50])
    x = rng.choice([95, 110, 125, 140, 148])
    return (f"A movie starts at {h}:{mnt:02d} p.m. and lasts {x} minutes. What time does "
            f"it end?")


def m_unit_price():
    s1, p1 = rng.choice([(500, 3.2), (750, 4.5), (400, 2.6)])
    s2, p2 = rng.choice([(1000, 5.9), (1200, 7.8), (1500, 8.4)])
    item = rng.choice(["cereal", "coffee beans", "laundry soap", "oats", "rice", "dog food"])
    return (f"A {s1} g box of {item} costs ${p1:.2f} and a {s2} g box costs ${p2:.2f}. "
            f"Which one is the better deal per gram?")


MATH_GENERATORS = [
    m_shopping, m_change, m_sharing, m_speed, m_travel_time, m_discount, m_percent_of,
    m_average, m_linear, m_linear2, m_system, m_think_number, m_ages, m_dice, m_coins,
    m_marbles, m_marbles2, m_units, m_temperature, m_rectangle, m_circle, m_interest,
    m_recipe, m_work_rate, m_fractions, m_wages, m_pct_increase, m_ratio, m_clock,
    m_unit_price,
]
MATH_UNITS_EXTRA = 4  # unit conversion gets a few extra draws (its own three phrasings)

MATH_HAND = [
    # short
    "What is 15 times 12?",
    "What is 7 squared plus 3 cubed?",
    "Is 91 a prime number?",
    "What is the square root of 144?",
    "Round 3.14159 to two decimal places.",
    "What is 2 to the power of 10?",
    "Simplify the fraction 18/24.",
    "What is 0.75 as a fraction?",
    "Why can't you divide a number by zero?",
    "What is the least common multiple of 4 and 6?",
    "Expand (x + 3)(x - 2).",
    "Factor x^2 - 9.",
    "Solve x^2 - 5x + 6 = 0.",
    "What is the slope of the line through (1, 2) and (3, 8)?",
    "How many minutes are in a week?",
    "A cheetah can run at about 30 meters per second. How fast is that in kilometers per hour?",
    "What is the probability of drawing a heart from a standard deck of 52 cards?",
    "What is 3/4 divided by 1/2?",
    "Explain what a percentage is with a simple example.",
    "What is the sum of the angles in a triangle?",
    "Convert 0.2 into a percentage and a fraction.",
    "What is the mean, median and mode of 3, 7, 7, 2, 9?",
    "What does it mean for two events to be independent in probability?",
    # long
    "A school is organizing a field trip for 148 students and 12 teachers. Each bus holds 45 "
    "people. How many buses do they need, and how many empty seats will there be on the last "
    "bus?",
    "I'm trying to budget. My monthly income after tax is $2,800. Rent is $1,050, groceries "
    "are about $380, transport is $120 and my phone bill is $45. If I want to save 15% of my "
    "income, how much is left for everything else?",
    "A phone plan costs $25 a month plus $0.10 for every text message over 200 texts. Last "
    "month I sent 340 texts. How much was my bill? Please show the calculation.",
    "A store sells pencils in packs of 12 for $3 and single pencils for $0.30 each. I need 30 "
    "pencils. What is the cheapest way to buy them, and how much will it cost?",
    "Two friends start walking toward each other from towns 24 km apart. One walks at 5 km/h "
    "and the other at 3 km/h. After how many hours do they meet, and how far has each one "
    "walked?",
    "A tank holds 200 liters of water. It leaks 3 liters every hour, and a tap adds 8 liters "
    "every hour. If it starts with 50 liters, how many hours until it is full?",
    "In a survey of 60 people, 35 said they like tea, 30 said they like coffee and 10 said "
    "they like both. How many people like neither tea nor coffee? Explain your reasoning.",
    "A rectangle's length is 3 cm more than twice its width, and its perimeter is 36 cm. "
    "Write an equation for this and solve it to find the length and the width.",
    "My car uses 6.5 liters of fuel per 100 km and fuel costs $1.80 per liter. How much will "
    "the fuel cost for a 420 km round trip?",
    "A painter charges a $40 call-out fee plus $25 per hour. Another painter charges $35 per "
    "hour with no fee. For how many hours of work do both painters cost the same?",
    "A bakery sold 120 muffins on Monday. On Tuesday it sold 25% more than on Monday, and on "
    "Wednesday it sold 20% fewer than on Tuesday. How many muffins did it sell on Wednesday?",
    "A class of 25 students has an average test score of 72. A new student joins and scores "
    "98 on the same test. What is the new class average?",
    "I have $10,000 to invest for three years at 4% interest compounded once a year. How much "
    "will I have at the end, and how much of that is interest?",
    "A spinner has eight equal sections numbered 1 to 8. If I spin it twice, what is the "
    "probability that both spins land on an even number? Explain step by step.",
    "A map has a scale of 1:50,000. Two villages are 7.5 cm apart on the map. How far apart "
    "are they in real life, in kilometers?",
    "An online course has 36 lessons. If I finish 4 lessons on weekdays and 6 on weekend "
    "days, starting on a Monday, on which day will I finish the course?",
    "A gym offers two plans. Plan A costs $30 a month. Plan B costs $200 for the whole year, "
    "paid up front. If I'm not sure I'll keep going after six months, which plan makes more "
    "sense? Show the numbers.",
    "A jar contains only nickels (5 cents) and dimes (10 cents). There are 30 coins in total "
    "and they are worth $2.10. How many of each coin are there? Set up the equations and "
    "solve them.",
    "A pizza is cut into 8 equal slices. Jo eats 3 slices, Kai eats a quarter of the pizza, "
    "and Lee eats one slice. What fraction of the pizza is left? Explain how you worked it "
    "out.",
    "A runner finishes a 10 km race in 52 minutes. What is her average pace in minutes per "
    "kilometer, and how long would a half marathon (21.1 km) take her at the same pace?",
    "The price of a laptop was increased by 10% and later decreased by 10%. My friend says "
    "the price is now back where it started. Is that right? Use an example price to explain.",
]


def build_math():
    p = draw([(gen, 3 + (MATH_UNITS_EXTRA if gen is m_units else 0)) for gen in MATH_GENERATORS])
    p += MATH_HAND
    return p


# ---------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------

WRITE_EMAIL_TOPICS = [
    "to my landlord asking them to fix a leaking kitchen tap",
    "to a coworker thanking them for covering my shift last weekend",
    "to my manager asking for Friday afternoon off",
    "to my son's teacher explaining that he will miss school on Monday",
    "to a neighbor inviting them to a small garden party on Saturday",
    "to a customer apologizing for a late delivery",
    "to an old friend I have not talked to in a year",
    "to a hotel asking whether they have a room free for two nights in June",
    "to my team announcing that the weekly meeting is moving to Thursday",
    "to a company asking about the status of my job application",
    "to my gym cancelling my membership",
    "to a colleague asking for feedback on a draft report",
    "to a club organizer saying I can no longer come to the event",
    "to a new coworker welcoming them to the team",
    "to a professor asking for a short extension on an essay",
    "to a plumber asking for a price quote for fixing a shower",
]

WRITE_EMAIL_TEMPLATES = [
    "Write a short email {t}.",
    "Draft a polite email {t}. Keep it under 120 words.",
    "Help me write a friendly but brief email {t}.",
    "Write an email {t}. Keep the tone warm and sign it as Sam.",
]

WRITE_STORY_TOPICS = [
    "a robot who learns to bake bread",
    "a lighthouse keeper who finds a message in a bottle",
    "a girl who can talk to birds",
    "a lost dog finding its way home",
    "two rival chefs who are forced to cook together",
    "a kid who finds a map hidden in a library book",
    "a tiny dragon who is afraid of fire",
    "an old man planting a tree he will never see grow",
    "a spaceship crew that runs out of coffee",
    "a snowman who wants to see summer",
    "a shy student on the first day at a new school",
    "a bicycle that can talk",
    "a town where the rain falls upward",
    "a cat detective solving the case of the missing sandwich",
    "a grandmother's secret soup recipe",
    "the last bookstore in a big city",
    "a penguin who wants to fly",
]

WRITE_STORY_TEMPLATES = [
    "Write a short story about {t}.",
    "Write a very short story (under 150 words) about {t}.",
    "Tell me a bedtime story for a five-year-old about {t}.",
    "Write the opening paragraph of a story about {t}.",
    "Write a 100-word story with a surprise ending about {t}.",
]

WRITE_POEM_TOPICS = [
    "autumn leaves", "morning coffee", "the ocean at night", "a rainy Monday",
    "a cat sleeping in the sun", "the first snow of winter", "city lights at night",
    "an old pair of shoes", "friendship", "the moon", "a garden in spring",
    "a long train ride", "homework", "the smell of fresh bread", "a thunderstorm",
    "a quiet library", "growing older", "a summer picnic", "a mountain sunrise",
]

WRITE_POEM_TEMPLATES = [
    "Write a haiku about {t}.",
    "Write a four-line rhyming poem about {t}.",
    "Write a funny limerick about {t}.",
    "Write a short poem for a young child about {t}.",
    "Write a short free-verse poem about {t}.",
]

PASSAGES = [
    "The town library will close for renovation from May 1 to August 31. During this time, "
    "books can be returned at the community center on Elm Street, and a small lending corner "
    "will be open there on weekdays from 10 a.m. to 4 p.m. When the library reopens, it will "
    "have a larger children's section, a quiet study room and faster internet. The city "
    "council says the project is paid for by a state grant and will not raise local taxes.",
    "Walking for thirty minutes a day can make a real difference to your health. It "
    "strengthens the heart, helps control weight and can lift your mood. Unlike many other "
    "kinds of exercise, walking needs no special equipment or gym membership, and most people "
    "can fit it into their day by taking the stairs, getting off the bus a stop early or "
    "walking during lunch. Doctors often recommend it as a first step for people who want to "
    "become more active.",
    "Honeybees live in colonies that can contain tens of thousands of bees. Each colony has one "
    "queen, who lays the eggs, a few hundred male drones, and many female worker bees. The "
    "workers do almost everything else: they collect nectar and pollen, build wax comb, care "
    "for the young and defend the hive. When a worker finds a good patch of flowers, she "
    "returns and performs a 'waggle dance' that tells the others where to go.",
    "Starting next month, our office will move to a hybrid schedule. Everyone is expected to "
    "work from the office on Tuesdays and Thursdays, and may choose to work from home on the "
    "other days. Desks will no longer be assigned; instead, staff can book a desk through the "
    "new booking app. Team leads will hold a short meeting next week to answer questions and "
    "help people set up the app.",
    "The first bicycles, built in the early 1800s, had no pedals at all; riders pushed "
    "themselves along with their feet. Pedals were later attached to the front wheel, which "
    "led to the tall 'penny-farthing' with its huge front wheel. These were fast but "
    "dangerous. In the 1880s the 'safety bicycle' appeared, with two wheels of the same size "
    "and a chain driving the back wheel. Its design is still the basis of most bikes today.",
    "Volunteers in the Riverside neighborhood have turned an empty lot into a community "
    "garden. Over two years they removed trash, built twenty raised beds and installed a "
    "rain barrel system. Families can now rent a bed for a small yearly fee, and a share of "
    "the vegetables goes to the local food bank. The organizers say the garden has also "
    "helped neighbors get to know each other, and they hope to add a small orchard next "
    "spring.",
    "Coral reefs cover less than one percent of the ocean floor, yet they are home to about a "
    "quarter of all marine species. Reefs are built by tiny animals called coral polyps, which "
    "live together with algae that give them food and color. When the water becomes too warm, "
    "the corals push out the algae and turn white, a process called bleaching. If the water "
    "does not cool down, the corals can starve and die.",
    "I ordered a blue winter coat from your website on March 3 and paid for express delivery. "
    "The coat arrived ten days later, and it was black, not blue. I emailed customer service "
    "twice but have not received any answer. I would like either the correct coat or a full "
    "refund, including the delivery fee. Please reply within a week so we can sort this out.",
    "These wireless earbuds are light and comfortable, and the sound is clear for the price. "
    "Pairing with my phone took only a few seconds. However, the battery lasts only about "
    "three hours, which is less than advertised, and the charging case feels cheap. They are "
    "fine for the gym or a short commute, but I would not recommend them for long flights.",
    "Notes from Monday's team meeting: the website redesign is two weeks behind because the "
    "photos from the marketing team arrived late. Priya will ask the designer whether the new "
    "homepage can launch first and the other pages later. Tom will update the budget by "
    "Wednesday. The next meeting is moved to Friday at 10 a.m. because of the public holiday.",
    "Sleep is not just rest. While we sleep, the brain sorts and stores memories from the day, "
    "and the body repairs muscles and releases important hormones. Adults generally need seven "
    "to nine hours a night. Regularly sleeping less than that is linked to poorer "
    "concentration, a weaker immune system and a higher risk of some long-term illnesses. "
    "Keeping a regular bedtime and avoiding screens before bed can help.",
    "We spent three days in the old port town and could easily have stayed a week. Mornings "
    "started with fresh bread from the bakery under our apartment, followed by long walks "
    "along the harbor. The fish market was noisy and wonderful. The only downside was the "
    "crowds around midday, so our advice is to visit the main square early and save the "
    "afternoons for the quieter beaches south of town.",
    "Paper money was first widely used in China more than a thousand years ago. Carrying large "
    "amounts of heavy metal coins was difficult for merchants, so they began leaving coins with "
    "trusted shops and receiving paper notes in return. Later the government took over printing "
    "the notes. The idea slowly spread to other parts of the world, and today almost every "
    "country prints its own paper currency.",
    "Our school's science fair will take place on April 18 in the gym. Every student in grades "
    "five to eight may enter, alone or in pairs. Projects must include a poster and a short "
    "written report, and any experiment using heat or chemicals must be approved by a teacher "
    "first. Judges will give prizes for the best experiment, the best poster and the most "
    "creative idea.",
    "Our city will introduce a new recycling system on July 1. Each household will get a "
    "blue bin for paper and cardboard and a yellow bin for plastic, metal and glass. Food "
    "waste will go in a small green caddy that is collected every week, while the blue and "
    "yellow bins will be emptied every two weeks. Collection days will be printed on a "
    "calendar that will be mailed to every home in June.",
    "Octopuses are some of the most intelligent animals in the sea. They can open jars, "
    "escape from tanks and recognize individual people. Each of their eight arms contains "
    "many nerve cells, so the arms can react to touch and taste almost on their own. "
    "Octopuses can also change the color and texture of their skin in a fraction of a "
    "second, which helps them hide from predators and sneak up on prey.",
    "After a long discussion, the parents' association has decided to replace the school's "
    "old playground instead of repairing it. The new playground will include a climbing "
    "wall, a wheelchair-accessible swing and more shade trees. About two thirds of the money "
    "has already been raised through bake sales and a fun run. The association is asking "
    "local businesses to help cover the rest before construction starts in the fall.",
    "Learning to play a musical instrument as an adult is harder in some ways than learning "
    "as a child, but it has advantages too. Adults usually understand music theory faster, "
    "can plan their practice better and choose music they truly enjoy. The main challenges "
    "are finding time and being patient with slow progress. Teachers suggest short daily "
    "practice sessions rather than one long session a week.",
]

PASSAGE_WRAPPERS = [
    "Summarize the following paragraph in one sentence:\n\n{t}",
    "Give me a two-sentence summary of this text.\n\n{t}",
    "What is the main point of this passage?\n\n{t}",
    "Summarize this for a ten-year-old:\n\n{t}",
    "Turn this paragraph into three short bullet points:\n\n{t}",
    "Read this and write a short headline for it.\n\n{t}",
    "Can you shorten this to about 30 words without losing the key facts?\n\n{t}",
]

WRITE_INFORMAL_SENTENCES = [
    "hey, can u send me the report asap? thx",
    "we can't do the meeting tomorrow, something came up",
    "we're gonna be a bit late, traffic is crazy",
    "your package is late because our truck broke down, sorry",
    "I don't want to go to the party, I'm tired",
]

WRITE_INFORMAL_TEMPLATES = [
    "Rewrite this sentence so it sounds more formal: \"{t}\"",
    "How would I say this in a professional email? \"{t}\"",
]

WRITE_BLUNT_SENTENCES = [
    "the food was kinda bad and the waiter was super slow",
    "I need the money you owe me back by next week",
    "the printer is broken again, somebody fix it",
    "stop leaving your dishes in the sink",
]

WRITE_BLUNT_TEMPLATES = [
    "Make this sound friendlier and more polite: \"{t}\"",
    "Rewrite this so it is kind but still clear: \"{t}\"",
]

WRITE_WORDY_SENTENCES = [
    "In my opinion I personally think that we should maybe consider possibly changing the plan",
    "Due to the fact that it was raining, the game was cancelled at this point in time",
    "The reason why I am writing this email is because I wanted to ask you a question",
    "Please don't forget that you have to remember to bring the documents with you",
]

WRITE_WORDY_TEMPLATES = [
    "Rewrite this sentence so it is shorter and clearer: \"{t}\"",
    "Cut the extra words from this sentence: \"{t}\"",
]

WRITE_ERROR_SENTENCES = [
    "Me and him goes to the store every saturday.",
    "Their going to announce the results tomorow.",
    "She don't like coffee, she prefer tea.",
    "Its a beautiful day, lets go to the park.",
    "I have went to London three times last year.",
    "The team have lost there last four games.",
    "Between you and I, the plan wont work.",
    "He runned to the bus stop but it already leave.",
    "Everyone should bring their own lunch, and dont forget you're water bottle.",
    "Could you borrow me your pen for a minute?",
]

WRITE_ERROR_TEMPLATES = [
    "Fix the grammar and spelling in this sentence: \"{t}\"",
    "Correct the mistakes in this sentence and briefly explain what you changed: \"{t}\"",
]

WRITE_PRODUCTS = [
    "a water bottle that keeps drinks cold for 24 hours",
    "a small bakery that opens at dawn",
    "a language-learning app for busy adults",
    "a handmade wooden chess set",
    "a neighborhood bike repair shop",
    "a pair of noise-cancelling headphones",
    "a board game about running a farm",
    "a weekend farmers market",
    "an app that reminds you to water your plants",
    "a cozy coffee shop with a reading corner",
    "a dog-walking service",
    "a solar-powered phone charger",
]

WRITE_PRODUCT_TEMPLATES = [
    "Write a short product description for {t}.",
    "Come up with three catchy names for {t}.",
    "Write a one-line slogan for {t}.",
    "Write a short, upbeat social media post advertising {t}.",
]

WRITE_HAND = [
    # short
    "Write a thank-you note to my aunt for the birthday sweater.",
    "Write a two-line birthday message for a coworker.",
    "Write a toast for my best friend's wedding. Keep it under 100 words.",
    "Write a short diary entry from the point of view of a houseplant.",
    "Write a text message telling a friend I'll be 15 minutes late.",
    "Give me five creative titles for a blog about budget travel.",
    "Write a short, funny dialogue between a cat and a vacuum cleaner.",
    "Write an acrostic poem using the word SPRING.",
    "Describe a busy train station in three sentences.",
    "Write a get-well-soon card message for a neighbor.",
    "Write a motivational quote about learning from mistakes.",
    "Write a short description of a sunset without using the word 'sun'.",
    "Write the first line of a mystery novel.",
    "Write a two-sentence horror story that is not too scary.",
    "Write a polite reminder that the rent is due on Friday.",
    # long
    "I'm applying for a part-time job at a local bookstore. I'm 19, I've read a lot since I "
    "was a kid, and I worked one summer at a cafe, so I know how to deal with customers. "
    "Write a short, friendly cover letter opening paragraph for me.",
    "My neighbor's dog barks for hours every afternoon while they are at work. I don't want to "
    "start a fight, but it is making it hard for me to work from home. Write a kind, short "
    "note I could leave in their mailbox.",
    "Write a short speech (about 150 words) that a class president could give at the end of "
    "the school year. It should thank the teachers, mention a few fun moments from the year, "
    "and wish everyone a good summer.",
    "I run a small online shop that sells handmade candles. A customer left a review saying "
    "the candle arrived broken. Write a short, polite public reply that apologizes and offers "
    "a replacement.",
    "Write a short LinkedIn 'About' section for a nurse who has worked in pediatrics for six "
    "years and is now moving into health education. It should sound professional but human.",
    "Write a short letter to my future self, to be opened in ten years. I'm 25, I just moved to "
    "a new city, and I'm starting my first real job as a graphic designer.",
    "Rewrite this paragraph in simple English for someone who is learning the language: "
    "\"Notwithstanding the inclement weather, the festival organizers elected to proceed with "
    "the outdoor performances, albeit with a reduced schedule and additional precautions for "
    "attendees.\"",
    "Write a short announcement for our apartment building's notice board: the water will be "
    "turned off on Thursday from 9 a.m. to 1 p.m. for pipe repairs, and residents should fill "
    "a few bottles in advance.",
    "Our book club just finished reading a novel about a family running a small hotel by the "
    "sea. Write five discussion questions we could use at our next meeting that don't require "
    "knowing the exact plot details.",
    "I have to give a one-minute introduction of myself at a new job. I'm Dana, I'm a data "
    "analyst, I have two kids, I love hiking, and I make terrible puns. Write something short "
    "and relaxed that I could say.",
    "Write a short review of an imaginary Italian restaurant. The pasta was excellent, the "
    "service was slow but friendly, and the prices were fair. Give it a star rating out of "
    "five.",
    "Turn these notes into a short, clear paragraph: meeting moved to 3pm; bring laptop; "
    "budget numbers due Monday; Alex is on vacation next week so send questions to Kim.",
    "Write a short poem for my grandfather's 80th birthday. He loves fishing, terrible jokes, "
    "and his old red pickup truck. It should be warm and a little bit funny.",
    "Write a short, persuasive paragraph for a school newsletter encouraging parents to "
    "volunteer one hour a month in the school library.",
    "My grandmother is turning 90 and the family is putting together a book of memories. "
    "Write a short paragraph I could add about how she taught me to make dumplings every "
    "Sunday when I was little, and how patient she always was.",
    "I volunteer at an animal shelter and we need a short adoption profile for Biscuit, a "
    "six-year-old beagle who is calm, loves naps, gets along with kids and is a bit shy with "
    "other dogs. Write something that makes people want to meet him.",
    "I need to tell my team that our project deadline is moving two weeks earlier because the "
    "client changed their plans. Write a short message that is honest about the pressure but "
    "still encouraging.",
    "Write a short, friendly welcome message for new members of our neighborhood running "
    "club. We meet Saturdays at 8 a.m. by the fountain in the park, all speeds are welcome, "
    "and we usually get coffee afterwards.",
]


def build_writing():
    p = []
    p += fill(WRITE_EMAIL_TEMPLATES, WRITE_EMAIL_TOPICS, 4)
    p += fill(WRITE_STORY_TEMPLATES, WRITE_STORY_TOPICS, 3)
    p += fill(WRITE_POEM_TEMPLATES, WRITE_POEM_TOPICS, 3)
    passages = list(PASSAGES)  # every passage once, wrappers dealt out in turn
    rng.shuffle(passages)
    p += [PASSAGE_WRAPPERS[i % len(PASSAGE_WRAPPERS)].format(t=x) for i, x in enumerate(passages)]
    p += fill(WRITE_INFORMAL_TEMPLATES, WRITE_INFORMAL_SENTENCES, 2)
    p += fill(WRITE_BLUNT_TEMPLATES, WRITE_BLUNT_SENTENCES, 2)
    p += fill(WRITE_WORDY_TEMPLATES, WRITE_WORDY_SENTENCES, 2)
    p += fill(WRITE_ERROR_TEMPLATES, WRITE_ERROR_SENTENCES, 5)
    p += fill(WRITE_PRODUCT_TEMPLATES, WRITE_PRODUCTS, 3)
    p += WRITE_HAND
    return p


# ---------------------------------------------------------------------------------------
# explanation
# ---------------------------------------------------------------------------------------

EXPLAIN_TOPICS = [
    # science
    "photosynthesis", "gravity", "the water cycle", "plate tectonics", "DNA",
    "natural selection", "the greenhouse effect", "a black hole", "static electricity",
    "friction", "sound", "the periodic table", "erosion", "magnetism",
    # technology
    "machine learning", "cloud computing", "encryption", "an operating system",
    "open-source software", "two-factor authentication", "a computer virus", "bandwidth",
    # health
    "the immune system", "blood pressure", "cholesterol", "metabolism", "antibiotic resistance",
    "dehydration", "the placebo effect",
    # economics
    "inflation", "supply and demand", "opportunity cost", "GDP", "the interest rate on a loan",
    "compound interest", "diversification in investing", "a budget deficit", "income tax",
    # history and society
    "the Renaissance", "the Industrial Revolution", "the Cold War", "the Silk Road",
    "feudalism", "democracy",
    # geography
    "the monsoon", "time zones", "the equator", "a river delta", "a glacier", "the Ring of Fire",
]

EXPLAIN_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Can you explain {t} to a high school student?",
    "Give me a short explanation of {t}.",
    "Explain {t} in three or four sentences.",
    "Why should I care about {t}? Give a short, practical answer.",
    "I keep hearing people talk about {t}, but I've never really understood the idea. Could "
    "you explain it simply and give me one everyday example?",
    "Describe {t} as if you were talking to a curious twelve-year-old.",
    "A friend and I were arguing about {t} last night and realized that neither of us could "
    "explain the idea properly. Can you explain it clearly and mention one common "
    "misconception?",
    "What should everyone know about {t}? Keep it brief.",
    "Write a short paragraph explaining {t} for someone with no background in the subject.",
    "I have a quiz tomorrow and my textbook's section on {t} confused me. Could you explain "
    "it in plain language, with one example that would help me remember it?",
    "Tell me about {t} in one short paragraph.",
]

EXPLAIN_HOW_TOPICS = [
    "a refrigerator", "a vaccine", "GPS", "a microwave oven", "Wi-Fi", "a solar panel",
    "an electric motor", "a credit card payment", "a search engine", "a rechargeable battery",
    "an airplane wing", "a thermostat", "a touchscreen", "a hydroelectric dam",
    "the human heart", "a compass",
]

EXPLAIN_HOW_TEMPLATES = [
    "How does {t} work?",
    "Can you explain how {t} works, step by step?",
    "In simple words, how does {t} work?",
    "My kid asked me how {t} works and I didn't know what to say. How would you explain it "
    "to a nine-year-old in a few sentences?",
]

EXPLAIN_DIFFS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("a meteor", "a meteorite"),
    ("speed", "velocity"), ("mass", "weight"), ("an atom", "a molecule"),
    ("a comet", "an asteroid"), ("RAM", "storage"), ("stocks", "bonds"),
    ("a recession", "a depression"), ("an alligator", "a crocodile"),
    ("a hurricane", "a tornado"), ("a country", "a continent"), ("a vegan", "a vegetarian"),
]

EXPLAIN_DIFF_TEMPLATES = [
    "What is the difference between {0} and {1}?",
    "How are {0} and {1} different?",
    "Could you explain the difference between {0} and {1} with an example?",
]

EXPLAIN_PEOPLE = [
    "Marie Curie", "Isaac Newton", "Ada Lovelace", "Nelson Mandela", "Cleopatra",
    "Leonardo da Vinci", "Mahatma Gandhi", "Charles Darwin", "Galileo Galilei", "Confucius",
    "Florence Nightingale", "Albert Einstein",
]

EXPLAIN_PEOPLE_TEMPLATES = [
    "Who was {t}, and why is this person remembered?",
    "Tell me briefly about the life and work of {t}.",
    "What is {t} best known for?",
]

EXPLAIN_EVENTS = [
    "World War I", "the French Revolution", "the fall of the Western Roman Empire",
    "the Great Depression", "the American Civil War", "the Black Death",
    "the Apollo 11 moon landing", "the fall of the Berlin Wall", "the invention of the printing press",
]

EXPLAIN_EVENT_TEMPLATES = [
    "What led to {t}?",
    "Give me a short overview of {t}.",
    "What were the most important effects of {t}?",
]

EXPLAIN_PLACES = [
    "the Amazon rainforest", "the Sahara Desert", "Mount Everest", "the Great Barrier Reef",
    "Iceland", "the Nile River", "the Dead Sea", "the Himalayas", "Antarctica",
    "the Grand Canyon",
]

EXPLAIN_PLACE_TEMPLATES = [
    "Tell me a few interesting facts about {t}.",
    "What makes {t} special from a geography point of view?",
]

EXPLAIN_HAND = [
    # why questions (short)
    "Why is the sky blue?",
    "Why do we have seasons?",
    "Why does ice float on water?",
    "Why do leaves change color in the fall?",
    "Why do we get goosebumps?",
    "Why does bread go stale?",
    "Why do onions make you cry?",
    "Why do cats purr?",
    "Why is the ocean salty?",
    "Why do airplanes leave white trails in the sky?",
    "Why do prices usually go up over time?",
    "Why do we yawn?",
    "Why do some countries drive on the left?",
    "Why does the moon look bigger near the horizon?",
    "Why do we need sleep?",
    "Why is regular exercise good for the heart?",
    "Why do metal spoons feel colder than wooden ones at the same temperature?",
    "Why do we see lightning before we hear thunder?",
    "Why did the Romans build so many roads?",
    "Why is Venus hotter than Mercury?",
    "Why do some vaccines need booster shots?",
    "Why do banks pay interest on savings?",
    "Why does hot air rise?",
    "Why do deserts get cold at night?",
    "Why can't humans breathe underwater?",
    "What causes earthquakes?",
    "What causes the northern lights?",
    "How do bees make honey?",
    "What does a central bank do?",
    "What is the difference between a virus and malware on a computer?",
    # long, with context
    "My seven-year-old asked me why the moon changes shape every few weeks. I know it has "
    "something to do with sunlight, but I can't explain it well. How can I explain the phases "
    "of the moon to a child?",
    "I read that a teaspoon of a neutron star would weigh billions of tons. That sounds "
    "impossible. Can you explain in simple terms what a neutron star is and why it is so "
    "dense?",
    "My doctor told me my vitamin D is low and said I should get more sunlight. What does "
    "vitamin D actually do in the body, and why does sunlight help? Please keep it simple.",
    "In my economics class we talked about how raising the minimum wage has both benefits and "
    "costs. Can you explain the main arguments on each side in a balanced way?",
    "When I travel from New York to Tokyo I always feel awful for days. What exactly is jet "
    "lag, why does it happen, and why does flying east feel worse than flying west?",
    "I've noticed that my phone battery drains much faster in very cold weather, and sometimes "
    "the phone even turns off. Why does cold affect batteries like this?",
    "Everyone says you should not use antibiotics for a cold. I understand that colds are "
    "caused by viruses, but why exactly don't antibiotics work on viruses?",
    "I live near the coast and the tide comes in and goes out twice a day. I know the moon is "
    "involved, but why are there two high tides a day instead of one?",
    "My grandmother says that in her day a loaf of bread cost a few cents. Why was everything "
    "so much cheaper in the past, and does that mean people were richer?",
    "I keep seeing the word 'algorithm' in news stories about social media. What is an "
    "algorithm in this context, and how does it decide what posts I see?",
    "In history class we learned that the printing press changed Europe. How could one "
    "machine make such a big difference to religion, science and politics?",
    "We're planning a trip to Peru and friends warned us about altitude sickness in Cusco. "
    "What causes altitude sickness, and why does going up slowly help?",
    "My son is doing a school project about volcanoes and asked me why some volcanoes explode "
    "violently while others just let lava flow out slowly. Can you explain the difference in a "
    "way a middle-school student would understand?",
    "I'm trying to understand my electricity bill. It says I used 420 kilowatt-hours this "
    "month. What is a kilowatt-hour, and how can I tell which of my appliances use the most?",
    "I've started running in the mornings and people keep telling me to stretch and to drink "
    "water. What actually happens in my muscles when I run, and why do they feel sore the "
    "next day?",
    "My friend says that we only use ten percent of our brains. That sounds wrong to me. "
    "What does science actually say about how much of the brain we use?",
    "I just got my first credit card. The letter talks about an APR, a minimum payment and a "
    "grace period. Can you explain what each of these means and how I can avoid paying "
    "interest?",
    "We visited a cave last weekend and the guide pointed out stalactites and stalagmites. How "
    "do these formations grow, and why do they take so long to form?",
    "In the news they keep saying a central bank 'raised interest rates to fight inflation'. "
    "How is raising interest rates supposed to bring prices down? Please explain the chain of "
    "cause and effect.",
    "When I put a can of soda in the freezer and forgot about it, it burst. Why does water "
    "expand when it freezes, when most things shrink as they get colder?",
    "I'm reading a novel set in Victorian England and the characters keep dying of "
    "'consumption'. What was consumption, why was it so common then, and is it still a "
    "problem today?",
    "Our town is debating whether to build wind turbines on the hills nearby. How do wind "
    "turbines actually turn wind into electricity, and what are the main pros and cons people "
    "usually raise?",
]


def build_explanation():
    p = []
    p += fill(EXPLAIN_TEMPLATES, EXPLAIN_TOPICS, 3)
    p += fill(EXPLAIN_HOW_TEMPLATES, EXPLAIN_HOW_TOPICS, 4)
    p += fill(EXPLAIN_DIFF_TEMPLATES, EXPLAIN_DIFFS, 4)
    p += fill(EXPLAIN_PEOPLE_TEMPLATES, EXPLAIN_PEOPLE, 3)
    p += fill(EXPLAIN_EVENT_TEMPLATES, EXPLAIN_EVENTS, 3)
    p += fill(EXPLAIN_PLACE_TEMPLATES, EXPLAIN_PLACES, 4)
    p += EXPLAIN_HAND
    return p


# ---------------------------------------------------------------------------------------
# chat
# ---------------------------------------------------------------------------------------

CHAT_FUN_TOPICS = [
    "cats", "penguins", "coffee", "pizza", "the ocean", "octopuses", "honey", "the moon",
    "sloths", "bananas", "trains", "clouds", "volcanoes", "owls",
]

CHAT_FUN_TEMPLATES = [
    "Tell me a joke about {t}.",
    "Do you know a good pun about {t}?",
    "Tell me a fun fact about {t}.",
    "What's something surprising about {t}?",
]

CHAT_TIP_TOPICS = [
    "falling asleep faster", "staying focused while studying", "keeping houseplants alive",
    "saving money on groceries", "making friends in a new city", "preparing for a job interview",
    "training for my first 5K run", "learning a new language as an adult",
    "staying motivated to exercise", "making a long commute less boring",
    "keeping my desk organized", "drinking more water during the day",
    "getting along with a new roommate", "spending less time on my phone",
    "cooking healthy meals on a busy schedule", "remembering people's names",
    "staying calm before a presentation", "writing in a journal every day", "waking up earlier",
    "being more patient with my kids",
]

CHAT_TIP_TEMPLATES = [
    "Do you have any tips for {t}?",
    "What are some simple ways of {t}?",
    "Give me five quick tips for {t}.",
    "I've been struggling with {t} for a while now. I've read the usual advice online, but "
    "none of it has really stuck. What would you suggest that is practical and easy to start "
    "this week?",
    "What's the best advice you have for {t}?",
]

CHAT_HOBBIES = [
    "running", "journaling", "playing the guitar", "gardening", "photography", "baking bread",
    "meditation", "knitting", "birdwatching", "chess", "rock climbing", "watercolor painting",
]

CHAT_HOBBY_TEMPLATES = [
    "I want to start {t}. Where should I begin?",
    "I'm thinking about taking up {t}. Any advice for a total beginner?",
    "Is {t} a good hobby for someone who works long hours? I usually only have a free hour "
    "in the evening and a bit of time on weekends, and I don't want something expensive.",
]

CHAT_RECO_TOPICS = [
    "a few easy vegetarian dinners", "some board games for a family night",
    "a few classic novels for a teenager", "some indoor activities for a rainy weekend",
    "a few stretches I can do at my desk", "some easy songs to learn on the piano",
    "a few low-cost date ideas", "some snacks for a long road trip",
    "a few houseplants that are hard to kill", "some good habits for a new school year",
]

CHAT_RECO_TEMPLATES = [
    "Can you recommend {t}?",
    "Could you suggest {t}? A short list with one sentence about each would be great.",
]

CHAT_GIFT_TOPICS = [
    "my dad, who loves fishing", "a friend who just moved into a new apartment",
    "a coworker who is retiring", "a ten-year-old who loves science", "a coffee lover",
    "my grandmother, who likes gardening", "a teacher at the end of the school year",
    "my sister, who is learning to cook",
]

CHAT_GIFT_TEMPLATES = [
    "What's a good gift for {t}?",
    "I need a birthday present idea for {t}. Any suggestions under $30?",
]

CHAT_PAIRS = [
    ("cats", "dogs"), ("mornings", "evenings"), ("the beach", "the mountains"),
    ("books", "movies"), ("tea", "coffee"), ("summer", "winter"),
    ("working from home", "working in an office"), ("paper books", "e-books"),
    ("city life", "country life"), ("pancakes", "waffles"),
]

CHAT_PAIR_TEMPLATES = [
    "Which do you prefer: {0} or {1}?",
    "What do you think is better, {0} or {1}, and why?",
    "Settle a friendly debate for me: {0} or {1}?",
]

CHAT_FAVORITES = ["season", "kind of weather", "word", "planet", "dessert", "time of day"]

CHAT_FAVORITE_TEMPLATES = [
    "What's your favorite {t}, and why?",
    "If you had to pick just one {t}, which would it be?",
]

CHAT_HAND = [
    # short
    "Hi there!",
    "Good morning! How's it going?",
    "Tell me something interesting.",
    "I'm bored. Any ideas?",
    "What's your name?",
    "Can you tell me a joke?",
    "I had a really good day today!",
    "Thanks for your help earlier.",
    "What's a good name for a goldfish?",
    "Say something nice to cheer me up.",
    "Do you like music?",
    "It's raining again here. Ugh.",
    "Guess what? I finally finished my first marathon!",
    "What should I have for dinner tonight?",
    "What's a fun thing to do on a Sunday afternoon?",
    "Can we play twenty questions? You think of something.",
    "I can't decide what movie to watch tonight.",
    "How do you say 'thank you' in Spanish?",
    "What's the best way to start a Monday?",
    "Give me a compliment.",
    "What are you good at?",
    "Recommend me a name for my new bike.",
    "Is it normal to feel nervous before a first date?",
    # long
    "I just moved to a new city for work and I don't know anyone here. I'm a bit shy and I "
    "work from home most days. What are some realistic ways I could meet people and make "
    "friends?",
    "My best friend forgot my birthday this year. I'm a little hurt, but I don't want to make "
    "a big deal of it. Should I say something to her, and if so, how?",
    "I've been learning the piano for six months and I feel like I'm not improving anymore. "
    "I practice about 20 minutes a day. Is this normal, and what can I change?",
    "We're adopting a cat next week. It's our first pet, and we live in a small apartment. "
    "What should we buy beforehand, and how do we help the cat settle in?",
    "I'm 34 and thinking about going back to university to study nursing. Part of me thinks "
    "I'm too old to start over. What do you think, and what should I consider?",
    "My coworker keeps taking credit for my ideas in meetings. I don't want to seem "
    "aggressive, but it's frustrating. How could I handle this politely?",
    "I have a free Saturday and about $40 to spend. I like being outdoors, trying new food "
    "and taking photos. Can you suggest a plan for the day?",
    "My teenage son spends most evenings gaming in his room. I don't want to ban it, but I'd "
    "like us to spend more time together. Any ideas that he might actually enjoy?",
    "I get really anxious when I have to make phone calls, even simple ones like booking a "
    "haircut. Do you have any practical tips that could make it easier?",
    "My friends want to go on a week-long hiking trip, but I've never hiked more than a few "
    "hours. The trip is in three months. Is that enough time to get ready, and how should I "
    "prepare?",
    "I'm hosting Thanksgiving for the first time, for ten people, and one guest is vegan and "
    "another can't eat gluten. I'm feeling overwhelmed. Where should I start?",
    "My roommate and I keep arguing about cleaning. She thinks I'm messy and I think she's "
    "too strict. How can we agree on a fair system without more fighting?",
    "I've been offered a promotion to team lead, but I'm not sure I want to manage people. I "
    "really enjoy the hands-on work I do now. How should I think about this decision?",
    "I'd like to read more books, but every time I start one I get distracted by my phone "
    "after a few pages. What has worked for other people?",
    "Our family is planning a picnic with grandparents and three small kids. What food and "
    "games would work well for everyone, from age 3 to age 80?",
    "I want to surprise my partner for our fifth anniversary, but we're saving money so I "
    "can't spend much. She loves stargazing, old movies and Thai food. Any ideas for a "
    "special evening?",
    "I've been working from home for two years and I feel kind of lonely and stuck in a "
    "routine. I don't want to quit my job. What small changes could make my days feel better?",
    "My eight-year-old daughter is scared of the dark and has trouble falling asleep. We've "
    "tried a night light, but she still calls us every night. What else could we try?",
    "I'm going to a wedding where I'll only know the bride, and I'm worried I'll spend the "
    "whole evening standing alone. Any tips for chatting with strangers at events like this?",
    "I recently retired after forty years as an accountant and suddenly have a lot of free "
    "time. I like numbers, history and being outside. What could I do to stay busy and feel "
    "useful?",
    "I keep starting new hobbies, like guitar, painting and coding, and then quitting after a "
    "few weeks. Is something wrong with me, or is this normal? How can I stick with one thing?",
    "We have a long car trip coming up, about eight hours, with two kids aged 6 and 9. What "
    "can we do to keep everyone from getting bored or grumpy?",
    "My friend just lost her job and she's really down. I want to support her without being "
    "pushy or saying the wrong thing. What could I say or do?",
]


def build_chat():
    p = []
    p += fill(CHAT_FUN_TEMPLATES, CHAT_FUN_TOPICS, 3)
    p += fill(CHAT_TIP_TEMPLATES, CHAT_TIP_TOPICS, 4)
    p += fill(CHAT_HOBBY_TEMPLATES, CHAT_HOBBIES, 3)
    p += fill(CHAT_RECO_TEMPLATES, CHAT_RECO_TOPICS, 5)
    p += fill(CHAT_GIFT_TEMPLATES, CHAT_GIFT_TOPICS, 4)
    p += fill(CHAT_PAIR_TEMPLATES, CHAT_PAIRS, 3)
    p += fill(CHAT_FAVORITE_TEMPLATES, CHAT_FAVORITES, 3)
    p += CHAT_HAND
    return p


# ---------------------------------------------------------------------------------------
# reasoning
# ---------------------------------------------------------------------------------------

REASON_PLAN_TOPICS = [
    "a weekend camping trip on a small budget", "a child's birthday party at home",
    "studying for a math exam in one week", "cleaning out a messy garage in one day",
    "a week of healthy packed lunches", "moving to a new apartment",
    "starting a small vegetable garden", "learning to swim as an adult",
    "hosting a dinner for eight friends", "writing a ten-page school report in two weeks",
    "organizing a neighborhood cleanup day", "a three-day trip to a new city",
    "saving $1,000 in six months", "getting ready for a job interview next Tuesday",
    "teaching a new puppy to sit and stay", "reading twelve books in a year",
]

REASON_PLAN_TEMPLATES = [
    "Make a simple step-by-step plan for {t}.",
    "Help me plan {t}. List the steps in the order I should do them.",
    "I need help with {t}, and I've never done anything like it before. What would be a "
    "sensible plan? Think about what has to happen first and what can wait.",
    "Help me break {t} into small, manageable steps, and say roughly how long each one takes.",
]

REASON_HOWTO_TOPICS = [
    "change a flat bicycle tire", "make a good cup of tea", "boil an egg so the yolk stays soft",
    "back up the photos on a phone", "plant a young tree", "wash a wool sweater by hand",
    "make a paper airplane", "set up a simple monthly budget", "pack a suitcase for a week away",
    "clean a laptop keyboard safely",
]

REASON_HOWTO_TEMPLATES = [
    "Explain step by step how to {t}.",
    "Walk me through how to {t}, one numbered step at a time.",
]

REASON_DECISIONS = [
    ("renting an apartment", "buying a small house"),
    ("a job with higher pay and a long commute", "a job with lower pay close to home"),
    ("learning Python first", "learning JavaScript first"),
    ("buying a new car", "buying a used car"),
    ("studying abroad for a year", "staying at my home university"),
    ("adopting a puppy", "adopting an older dog"),
    ("taking the train", "driving for a 300 km trip"),
    ("repairing my old laptop", "buying a new one"),
]

REASON_DECISION_TEMPLATES = [
    "I have to choose between {0} and {1}. What factors should I weigh?",
    "Help me reason through a decision: {0} or {1}? List the pros and cons of each, then "
    "give a recommendation and explain how you reached it.",
]

REASON_WHATIF = [
    "the Moon suddenly disappeared", "everyone stopped using cash tomorrow",
    "a city banned all cars from its center", "it did not rain in a farming town for a whole year",
    "the internet went down worldwide for a week", "every school switched to a four-day week",
    "humans only needed two hours of sleep", "all the bees in the world vanished",
]

REASON_WHATIF_TEMPLATES = [
    "What would happen if {t}? Think it through step by step.",
    "Imagine that {t}. What are three likely consequences, and why?",
]

SYLLOGISMS = [
    "All roses are flowers. Some flowers fade quickly. Can we conclude that some roses fade "
    "quickly? Explain your reasoning.",
    "All of my cousins live in Spain. Marta lives in Spain. Is Marta my cousin? Explain.",
    "No reptiles have fur. All snakes are reptiles. What can we conclude about snakes and fur?",
    "If it rains, the match is cancelled. The match was not cancelled. Did it rain? Explain.",
    "Every student in the chess club also plays in the band. Leo is not in the band. Is Leo in "
    "the chess club?",
    "Some teachers are runners. All runners own sneakers. Does it follow that some teachers own "
    "sneakers? Why or why not?",
    "If a shape is a square, it has four sides. This shape has four sides. Is it definitely a "
    "square? Explain.",
    "Whenever the alarm rings, the dog barks. The dog is barking. Must the alarm be ringing? "
    "Explain your answer.",
]


_DEALS = {}


def deal(key, items):
    """Next item of a seeded shuffle of `items`; repeats only after all have been used."""
    if not _DEALS.get(key):
        _DEALS[key] = list(items)
        rng.shuffle(_DEALS[key])
    return _DEALS[key].pop()


def r_order():
    a, b, c = rng.sample(NAMES, 3)
    more, less = deal("order", [("taller", "shorter"), ("older", "younger"),
                                ("faster", "slower"), ("heavier", "lighter")])
    return (f"{a} is {more} than {b}. {c} is {less} than {b}. Who is the {more[:-2]}est, and "
            f"who is the {less[:-2]}est? Explain.")


RACE_TEMPLATES = [
    "In a three-person race, {b} finished ahead of {a}, and {c} finished behind {a}. Who came "
    "in second? Explain how you know.",
    "Three kids ran a sprint at sports day. {c} was slower than {a}, and {a} was slower than "
    "{b}. Who won the silver medal?",
    "{a}, {b} and {c} took a spelling test. {b} scored higher than {a}, and {a} scored higher "
    "than {c}. Put them in order from highest to lowest score and explain.",
]


def r_race():
    a, b, c = rng.sample(NAMES, 3)
    return deal("race", RACE_TEMPLATES).format(a=a, b=b, c=c)


def r_seats():
    a, b, c, d = rng.sample(NAMES, 4)
    return (f"Four friends, {a}, {b}, {c} and {d}, sit in a row of four chairs. {a} sits at the "
            f"left end, {b} sits right next to {a}, and {d} does not sit next to {b}. "
            f"Where does {c} sit? Explain your reasoning.")


def r_seq_arith():
    start, step = rng.randint(1, 20), rng.choice([3, 4, 6, 7, 9, 11])
    seq = ", ".join(str(start + i * step) for i in range(5))
    return f"What number comes next in this sequence: {seq}, ...? Explain the pattern."


def r_seq_geom():
    start, ratio = rng.choice([1, 2, 3, 5]), rng.choice([2, 3])
    seq = ", ".join(str(start * ratio ** i) for i in range(4))
    return f"Find the next two numbers in the sequence {seq}, ... and explain how you found them."


def r_seq_missing():
    start, step = rng.randint(2, 15), rng.randint(2, 8)
    terms = [str(start + i * i * step) for i in range(5)]
    terms[rng.randint(1, 3)] = "?"
    return (f"What is the missing number in {', '.join(terms)}? Hint: look at the differences "
            f"between the numbers.")


REASON_GENERATORS = [r_order, r_race, r_seats, r_seq_arith, r_seq_geom, r_seq_missing]

REASON_HAND = [
    # short
    "If today is Wednesday, what day of the week will it be 10 days from now?",
    "A clock shows 3:15. What is the angle between the hour hand and the minute hand?",
    "Five people are at a meeting and each shakes hands with every other person once. How many "
    "handshakes are there?",
    "Sara is older than Ben but younger than Kim. Is Kim older than Ben? Explain.",
    "If 5 workers take 6 days to paint a fence, how long would 3 workers take at the same pace?",
    "How many 4-digit codes can you make from the digits 0 to 9 if no digit repeats?",
    "Which is more: 3 apples of 150 grams each, or 2 oranges of 200 grams each plus a 40-gram "
    "plum?",
    "I have a 4-liter jug and a 9-liter jug. How can I measure exactly 1 liter of water?",
    "Is it possible for a month to have five Sundays and five Mondays? Explain.",
    "What is the next letter in the series A, C, F, J, ...? Explain the rule.",
    "Count the number of squares of any size on a 3 by 3 grid. Show your reasoning.",
    "A bus leaves every 20 minutes starting at 7:00 a.m. I reach the stop at 8:35 a.m. How "
    "long will I wait?",
    # long
    "Three boxes are labeled A, B and C, and exactly one of them holds a prize. Box A says "
    "'The prize is here.' Box B says 'The prize is not here.' Box C says 'The prize is not in "
    "box A.' Only one of these statements is true. Which box has the prize? Explain.",
    "Liam says, 'Nora is lying.' Nora says, 'Omar is lying.' Omar says, 'Liam and Nora are "
    "both lying.' Exactly who is telling the truth? Work through the possibilities step by "
    "step.",
    "Four friends each ordered a different drink: tea, coffee, juice and water. Ana did not "
    "order a hot drink and does not like juice. Ben ordered coffee. Cleo ordered a hot drink. "
    "What did Dev order? Explain your reasoning.",
    "A recipe uses 3 eggs and 2 cups of flour per batch. I have 7 eggs and 6 cups of flour. "
    "How many full batches can I make, and what will I have left over? Think step by step.",
    "My bookshelf has 5 shelves and each shelf holds 30 books. I own 130 books and buy 4 new "
    "ones every month. After how many months will the bookshelf be completely full? Explain.",
    "A library charges $0.25 per day for the first week a book is late and $0.50 per day after "
    "that. How much do I owe if my book is 10 days late? Show each step.",
    "A train leaves at 2:45 p.m. and the trip normally takes 2 hours and 50 minutes. Today it "
    "is delayed by 15 minutes. What time will it arrive, and will I make a 6:00 p.m. dinner "
    "that is a 10-minute walk from the station?",
    "I have three tasks today: a report that takes about 2 hours and is due at 3 p.m., a "
    "30-minute call at 11 a.m., and grocery shopping that takes 45 minutes. I start work at "
    "9 a.m. and want an hour for lunch. Put these in a sensible order and explain why.",
    "I'm planning a picnic for Saturday. The forecast says a 60% chance of rain in the "
    "morning and 10% in the afternoon. The park is an hour away, and our two small kids nap "
    "after lunch. When should we go, and why?",
    "A farmer needs to take a fox, a goose and a bag of seeds across a river in a boat that "
    "carries only the farmer and one item. Left alone, the fox eats the goose and the goose "
    "eats the seeds. Describe a way to get everything across safely, step by step.",
    "Our team of six has to pick a time for a weekly one-hour meeting. Anna can't do mornings, "
    "Ben leaves at 4 p.m., Carla is busy from 1 to 2 p.m., and the rest are flexible. The "
    "office day runs 9 a.m. to 5 p.m. Which times work for everyone? Explain your reasoning.",
    "I have $50 to buy snacks for a class party of 24 kids. Juice boxes come in packs of 8 for "
    "$6, and cookies come in boxes of 12 for $5. If every kid gets one juice and two cookies, "
    "do I have enough money? Show your working.",
    "A drawer holds loose socks in three colors: red, blue and green, with plenty of each. In "
    "the dark, what is the smallest number of socks I must take out to be sure I have a "
    "matching pair? Explain why.",
    "A small shop sells lemonade for $2 a cup. Each cup costs them $0.80 to make, and they pay "
    "$30 a day for the stall. How many cups must they sell in a day to make a profit? Explain "
    "the steps.",
    "Two candles are the same height. The first burns down completely in 4 hours, the second "
    "in 6 hours. If both are lit at the same time, after how long will the second candle be "
    "exactly twice as tall as the first? Reason step by step.",
    "Emma, Finn and Gus each have a different pet: a dog, a cat or a parrot. Emma is allergic "
    "to fur. Finn's pet does not talk. Gus walks his pet every morning. Who owns which pet? "
    "Explain.",
    "I need to be at the airport at 7:30 a.m. The drive takes 40 minutes, I need 30 minutes "
    "to get ready, and I want a 15-minute buffer in case of traffic. What time should I set "
    "my alarm? Explain your reasoning step by step.",
    "A class has 30 students. Half of them play soccer, a third play basketball, and 5 play "
    "both. How many students play neither sport? Work through it step by step.",
    "I want to paint my bedroom. The four walls are each 4 m wide and 2.5 m high, and there is "
    "one door and one window that together take up about 3 square meters. One liter of paint "
    "covers 10 square meters and I want two coats. How many liters do I need?",
    "Three friends split a restaurant bill. Ana paid $31, Ben paid $20 and Cleo paid nothing. "
    "The total was $45 plus a $6 tip, and they want to share everything equally. Who owes "
    "whom, and how much? Explain.",
    "A baker has 5 hours before a market opens. Bread dough needs 1 hour to mix, 2 hours to "
    "rise and 45 minutes to bake, and only one batch fits in the oven at a time. Can she get "
    "two batches of bread ready in time if she starts the second dough while the first one "
    "rises? Explain step by step.",
    "My phone is at 20% battery and loses about 10% per hour while I use maps. The hike back "
    "to the car takes about 2 hours, and I also want to call my family when I arrive, which "
    "takes about 5%. Do I have enough battery? What should I do to be safe?",
    "A store has a deal: buy 2 shirts and get the third one half price. Shirts cost $18 each. "
    "I need 5 shirts. What is the cheapest way to buy them and how much will I pay? Explain.",
    "Every morning I either walk to work (35 minutes) or take the bus (10 minutes of walking "
    "plus a bus every 15 minutes that takes 12 minutes). On average, which option is faster? "
    "Explain your reasoning.",
]


def build_reasoning():
    p = []
    p += fill(REASON_PLAN_TEMPLATES, REASON_PLAN_TOPICS, 4)
    p += fill(REASON_HOWTO_TEMPLATES, REASON_HOWTO_TOPICS, 5)
    p += fill(REASON_DECISION_TEMPLATES, REASON_DECISIONS, 4)
    p += fill(REASON_WHATIF_TEMPLATES, REASON_WHATIF, 4)
    p += draw([(gen, 3) for gen in REASON_GENERATORS])
    p += SYLLOGISMS
    p += REASON_HAND
    return p


# ---------------------------------------------------------------------------------------
# build, split, write
# ---------------------------------------------------------------------------------------

BUILDERS = {
    "coding": build_coding,
    "math": build_math,
    "writing": build_writing,
    "explanation": build_explanation,
    "chat": build_chat,
    "reasoning": build_reasoning,
}


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def length_of(text: str) -> str:
    return "long" if len(text.split()) >= LONG_MIN_WORDS else "short"


def build_all():
    """All prompts as (category, length, prompt) in a fixed order; fails on any duplicate."""
    rows, seen = [], {}
    for cat in CATEGORIES:
        for text in BUILDERS[cat]():
            text = text.strip()
            key = normalize(text)
            if key in seen:
                raise SystemExit(f"duplicate prompt ({seen[key]} and {cat}): {text!r}")
            seen[key] = cat
            rows.append((cat, length_of(text), text))
    return rows


def split(rows):
    """Stratified split: round(15%) of every (category, length) group, at least one, to eval."""
    train, evals = [], []
    for cat in CATEGORIES:
        for length in ("short", "long"):
            group = [r for r in rows if r[0] == cat and r[1] == length]
            if not group:
                continue
            rng.shuffle(group)
            n_eval = max(1, round(len(group) * EVAL_FRACTION))
            evals += group[:n_eval]
            train += group[n_eval:]
    rng.shuffle(train)
    rng.shuffle(evals)
    return train, evals


def render(rows, prefix):
    lines = []
    for i, (cat, length, text) in enumerate(rows, 1):
        obj = {"id": f"{prefix}-{i:04d}", "category": cat, "length": length, "prompt": text}
        lines.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if the files on disk differ from a fresh build")
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: this one)")
    args = ap.parse_args(argv)

    train, evals = split(build_all())
    files = {"train.jsonl": render(train, "train"), "eval.jsonl": render(evals, "eval")}
    if args.check:
        stale = [n for n, text in files.items()
                 if not (args.out / n).exists()
                 or (args.out / n).read_text(encoding="utf-8") != text]
        if stale:
            print("out of date: " + ", ".join(stale), file=sys.stderr)
            return 1
        print("prompt files are up to date")
        return 0
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {len(train)} train and {len(evals)} eval prompts to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
