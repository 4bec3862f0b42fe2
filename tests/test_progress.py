import io

from geoserve.progress import Progress


def test_tty_bar_redraws_one_line_and_ends_with_newline():
    out = io.StringIO()
    p = Progress(40, out, tty=True)
    p.update(10)
    p.update(40, final=True)
    text = out.getvalue()
    assert text.count("\r[") == 2
    assert "10/40 patches" in text
    assert "40/40 patches" in text
    assert "ETA" in text
    assert text.endswith("\n")
    assert text.count("\n") == 1


def test_plain_lines_are_throttled_but_the_last_always_prints():
    out = io.StringIO()
    p = Progress(100, out, tty=False, interval=60)
    for done in range(1, 100):
        p.update(done)
    p.update(100, final=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first update, then the final one
    assert lines[-1].startswith("progress: 100/100 patches (100%)")
