"""A small bundled set of grade-school math word problems for the LLM-driven user (``LLMUser``).

Upstream's openclaw-test drives its student/teacher simulation with GSM8K; the embedded stack ships
its own twenty problems (written for this project, answers checked by hand) so the scenario runs
offline and without a dataset download. Answers are strings, as in upstream's JSON.
"""

from __future__ import annotations

from typing import TypedDict


class Problem(TypedDict):
    question: str
    answer: str


PROBLEMS: list[Problem] = [
    {"question": "Maya has 12 stickers. She buys 3 packs of 8 stickers and gives 10 stickers to her "
                 "brother. How many stickers does she have now?", "answer": "26"},
    {"question": "A baker makes 48 muffins and puts them into boxes of 6. He sells 5 boxes. How many "
                 "boxes are left?", "answer": "3"},
    {"question": "Tom reads 15 pages every weekday and 25 pages on each day of the weekend. How many "
                 "pages does he read in one week?", "answer": "125"},
    {"question": "A school bus has 9 rows with 4 seats each. 29 children get on. How many seats are "
                 "still empty?", "answer": "7"},
    {"question": "Lena saves $7 a week. How many weeks does she need to save to buy a game that costs "
                 "$63?", "answer": "9"},
    {"question": "A garden is 14 meters long and 9 meters wide. What is its perimeter in meters?",
     "answer": "46"},
    {"question": "There are 5 baskets with 18 apples each. A third of all the apples are green. How "
                 "many apples are green?", "answer": "30"},
    {"question": "A movie starts at 4:45 pm and lasts 1 hour and 50 minutes. At what time does it end?",
     "answer": "6:35 pm"},
    {"question": "Sam buys 4 notebooks at $2.50 each and a pen for $1.75. He pays with a $20 bill. How "
                 "much change does he get?", "answer": "8.25"},
    {"question": "A train travels 60 kilometers per hour. How far does it travel in 3 and a half "
                 "hours, in kilometers?", "answer": "210"},
    {"question": "Grace had 120 marbles. She lost 15 and then split the rest equally among 5 friends. "
                 "How many marbles did each friend get?", "answer": "21"},
    {"question": "A farmer has 23 cows and 4 times as many chickens. How many animals does he have in "
                 "total?", "answer": "115"},
    {"question": "A pizza is cut into 8 slices. Four friends each eat 3 slices. How many whole pizzas "
                 "did they need to order at least?", "answer": "2"},
    {"question": "Ivan runs 2.5 kilometers every morning. How many kilometers does he run in "
                 "30 days?", "answer": "75"},
    {"question": "A shirt costs $40 and is on sale for 25% off. What is the sale price in dollars?",
     "answer": "30"},
    {"question": "Nina is 3 times as old as her cousin. In 4 years the sum of their ages will be 32. "
                 "How old is Nina now?", "answer": "18"},
    {"question": "A tank holds 250 liters of water. It leaks 12 liters per hour. How many liters are "
                 "left after 8 hours?", "answer": "154"},
    {"question": "A class of 28 students goes on a trip. Each car takes 4 students and each van takes "
                 "8. If they use 3 vans, how many cars do they need for the rest?", "answer": "1"},
    {"question": "Omar planted 6 rows of 15 tulips. 18 of them did not bloom. How many tulips "
                 "bloomed?", "answer": "72"},
    {"question": "A library had 1,350 books. It bought 275 more and gave away 400 old ones. How many "
                 "books does it have now?", "answer": "1,225"},
]
