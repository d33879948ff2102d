"""Contamination in scripts without spaces (Chinese, Japanese, Thai): documents planted in a training set of many
rows are found at the count planted, each judged by n-grams of characters; documents that only share common short
phrases with the training rows are not; English beside them is still judged by the 13-word rule. Two eval files of
one name in different folders are two sources."""

import json
import random

from sftdoctor.facts.contamination import CJK, SOUTHEAST, WORD, distinct_names, rule_of, scan, units, words

# Written for this test, or public domain (Laozi 1, Analects 1.1, Hojoki's and Makura no Soshi's openings).
CHINESE = [
    "在Python中，列表推导式可以用一行代码生成新的列表，例如把1到10的平方放进一个list里。",
    "机器学习模型在训练集上表现很好，但在测试集上准确率只有62%，这通常说明出现了过拟合。",
    "长江是中国最长的河流，全长约6300公里，流经青海、西藏、四川、重庆、湖北等十一个省级行政区。",
    "请计算：一个长方形的长是12厘米，宽是8厘米，它的面积是多少平方厘米？答案是96平方厘米。",
    "光合作用是绿色植物利用太阳光能，把二氧化碳和水合成有机物，并释放出氧气的过程。",
    "秦始皇统一六国以后，在全国范围内统一了文字、货币和度量衡，对后世影响深远。",
    "道可道，非常道；名可名，非常名。无名天地之始，有名万物之母。",  # 24 characters: must occur whole
    "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？人不知而不愠，不亦君子乎？",
]
JAPANESE = [
    "ゆく河の流れは絶えずして、しかももとの水にあらず。よどみに浮かぶうたかたは、かつ消えかつ結びて、久しくとどまりたるためしなし。",
    "春はあけぼの。やうやう白くなりゆく山ぎは、すこしあかりて、紫だちたる雲のほそくたなびきたる。",
    "東京は日本の首都であり、約1400万人が住んでいる世界でも有数の大都市です。",
    "このプログラムはPythonで書かれていて、データを読み込んでからグラフを表示します。",
    "富士山は日本で最も高い山で、標高は3776メートルあり、多くの登山者が毎年訪れます。",
]
THAI = [
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทยและเป็นศูนย์กลางทางเศรษฐกิจที่สำคัญที่สุดของประเทศ",
    "แม่น้ำเจ้าพระยาไหลผ่านใจกลางกรุงเทพและเป็นเส้นทางคมนาคมทางน้ำที่สำคัญมาตั้งแต่อดีต",
    "นักเรียนควรอ่านหนังสืออย่างน้อยวันละหนึ่งชั่วโมงเพื่อพัฒนาทักษะการอ่านและการเขียน",
    "การปลูกข้าวเป็นอาชีพหลักของเกษตรกรจำนวนมากในภาคตะวันออกเฉียงเหนือของประเทศไทย",
    "ช้างเป็นสัตว์ประจำชาติของไทยและมีบทบาทสำคัญในประวัติศาสตร์และวัฒนธรรมไทย",
    "ฤดูฝนในประเทศไทยมักเริ่มต้นในเดือนพฤษภาคมและสิ้นสุดในเดือนตุลาคมของทุกปี",
]
ENGLISH = [
    "The quick brown fox jumps over the lazy dog near the old river bank at dawn, then runs home.",
    "A train leaves the station at nine and travels at sixty miles an hour; when does it arrive in the city?",
    "Water boils at one hundred degrees Celsius at sea level, but at a lower temperature on a high mountain.",
]
# What the unplanted documents share with the filler rows: the common short phrases of each language.
PHRASES = [
    "请回答下面的问题",
    "谢谢你的帮助",
    "长江是中国最长的河流，全长约6300公里",
    "学而时习之，不亦说乎",
    "光合作用是",
    "日本の首都",
    "よろしくお願いします",
    "富士山は日本で最も高い山で",
    "ประเทศไทย",
    "ขอบคุณมากครับ",
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
    "over the lazy dog",
    "thank you very much",
    "Python",
    "2024年",
]
PLANTED = {"zh": [0, 1, 6], "ja": [0, 3], "th": [1, 4], "en": [2]}


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def chat(user, answer="好的"):
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def training_set(path, planted, rows=3000):
    """`rows` filler rows of common phrases (never 25 characters of one document in a row), the planted documents
    (question and answer, as the eval file holds them) in conversations of their own among English turns, every
    other one with its punctuation and spacing changed the way copies are."""
    rng = random.Random(0)
    filler = [chat(" ".join(rng.sample(PHRASES, 4)), rng.choice(PHRASES)) for _ in range(rows)]
    for number, doc in enumerate(planted):
        copy = doc.replace("，", ", ").replace("。", ". ") if number % 2 else doc
        filler[(number + 1) * rows // (len(planted) + 1)] = {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. Answer in the language of the question."},
                *chat(f"Question {number}: {copy}")["messages"],
                {"role": "user", "content": "Thank you, and in English?"},
                {"role": "assistant", "content": "Sure, here it is."},
            ]
        }
    return write_rows(path, filler)


def test_planted_documents_in_three_scripts_without_spaces_are_found_at_the_count_planted(tmp_path):
    languages = {"zh": CHINESE, "ja": JAPANESE, "th": THAI, "en": ENGLISH}
    files = {lang: write_rows(tmp_path / f"{lang}.jsonl", [chat(d) for d in docs]) for lang, docs in languages.items()}
    planted = [languages[lang][i] for lang, numbers in PLANTED.items() for i in numbers]
    train = training_set(tmp_path / "train.jsonl", planted)
    found = scan({"train": [str(train)], "eval_files": [str(f) for f in files.values()], "tasks": [], "include": None})
    assert found["train_rows"] == 3000
    sources = {name.removeprefix("eval file ").removesuffix(".jsonl"): s for name, s in found["sources"].items()}
    assert {lang: s["touched"] for lang, s in sources.items()} == {lang: len(n) for lang, n in PLANTED.items()}
    assert sum(s["touched"] for s in sources.values()) == len(planted) == 8
    assert {lang: s["too_short"] for lang, s in sources.items()} == {"zh": 0, "ja": 0, "th": 0, "en": 0}
    assert sources["zh"]["rules"] == {CJK.label: 8} and sources["ja"]["rules"] == {CJK.label: 5}
    assert sources["th"]["rules"] == {SOUTHEAST.label: 6} and sources["en"]["rules"] == {WORD.label: 3}
    touched = {e["eval"].rsplit(" line ", 1)[1] for e in sources["zh"]["examples"]}
    assert touched == {"1", "2", "7"}  # the planted ones, by line; the others share only short phrases


def test_documents_sharing_only_common_phrases_are_not_flagged(tmp_path):
    docs = write_rows(tmp_path / "eval.jsonl", [chat(d) for d in CHINESE + JAPANESE + THAI + ENGLISH])
    train = training_set(tmp_path / "train.jsonl", [], rows=2000)
    found = scan({"train": [str(train)], "eval_files": [str(docs)], "tasks": [], "include": None})
    assert found["sources"]["eval file eval.jsonl"]["touched"] == 0


def test_each_document_takes_the_rule_of_the_script_most_of_it_is_in():
    assert units("请用Python 3写一个函数") == ["请", "用", "python", "3", "写", "一", "个", "函", "数"]
    assert words("请用Python 3写一个函数") == ["请用python", "3写一个函数"]  # the word rule's words, as lm-eval's
    assert rule_of(units(CHINESE[0])) is CJK  # Latin words and digits inside Chinese: characters still
    assert rule_of(units("the poem 静夜思 by Li Bai is read by every child in school")) is WORD
    assert rule_of(units(THAI[0])) is SOUTHEAST and rule_of(units(ENGLISH[0])) is WORD
    assert units("Plain English, as before: \\w+ lowercased.") == [
        "plain",
        "english",
        "as",
        "before",
        "w",
        "lowercased",
    ]


def test_a_huge_row_is_read_in_pieces_and_a_document_across_a_cut_is_still_found(tmp_path, monkeypatch):
    from sftdoctor.facts import contamination

    monkeypatch.setattr(contamination, "PIECE", 64)  # a 300-character row is cut four times
    eval_file = write_rows(tmp_path / "eval.jsonl", [chat(CHINESE[2]), chat(ENGLISH[0])])
    row = "天" * 50 + CHINESE[2] + "地" * 50 + " and " + ENGLISH[0] + " done"
    train = write_rows(tmp_path / "train.jsonl", [chat(row)])
    found = scan({"train": [str(train)], "eval_files": [str(eval_file)], "tasks": [], "include": None})
    assert found["sources"]["eval file eval.jsonl"]["touched"] == 2


def test_two_eval_files_of_one_name_are_two_sources_named_by_their_folders(tmp_path):
    dirty = write_rows(tmp_path / "a" / "test.jsonl", [chat(CHINESE[3]), chat(ENGLISH[1])])
    clean = write_rows(tmp_path / "b" / "test.jsonl", [chat(CHINESE[4])])
    train = write_rows(tmp_path / "train.jsonl", [chat("x"), chat(CHINESE[3])])
    found = scan({"train": [str(train)], "eval_files": [str(dirty), str(clean)], "tasks": [], "include": None})
    assert {name: s["touched"] for name, s in found["sources"].items()} == {
        "eval file a/test.jsonl": 1,
        "eval file b/test.jsonl": 0,
    }


def test_the_shortest_ending_that_tells_a_path_from_the_others_names_it():
    assert distinct_names(["/r/eval.jsonl"]) == {"/r/eval.jsonl": "eval.jsonl"}
    assert distinct_names(["/x/a/t.jsonl", "/x/b/t.jsonl", "/y/a/t.jsonl", "/y/c/e.jsonl"]) == {
        "/x/a/t.jsonl": "x/a/t.jsonl",
        "/x/b/t.jsonl": "b/t.jsonl",
        "/y/a/t.jsonl": "y/a/t.jsonl",
        "/y/c/e.jsonl": "e.jsonl",
    }
