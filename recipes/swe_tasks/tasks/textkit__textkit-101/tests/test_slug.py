from textkit import slugify


def test_plain_title():
    assert slugify("Hello World") == "hello-world"


def test_accents_are_dropped():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_underscores_are_separators():
    assert slugify("snake_case title") == "snake-case-title"


def test_max_length():
    assert slugify("abcdef ghi", max_length=4) == "abcd"


def test_no_edge_dashes():
    assert slugify("  Hello, World!  ") == "hello-world"


def test_repeated_dashes_collapse():
    assert slugify("Rock -- Paper") == "rock-paper"


def test_no_trailing_dash_after_cut():
    assert slugify("hello world", max_length=6) == "hello"
