from hypothesis import given, strategies as st

from mgeo_index.text import normalize


def test_full_width_case_spaces_and_noise():
    assert normalize("  北京市 朝阳区，建国路８８号Ａ座！ ") == "北京市朝阳区建国路88号a座"
    assert normalize("3-2-501室 (东门)") == "3-2-501室(东门)"  # separators and parentheses carry meaning
    assert normalize("a\x00b\tc") == "abc"


@given(st.text(max_size=60))
def test_idempotent(text):
    once = normalize(text)
    assert normalize(once) == once


@given(st.text(alphabet=st.sampled_from("北京朝阳区建国路0123456789号楼栋单元室abc-#"), max_size=40))
def test_keeps_every_address_character(text):
    assert normalize(text) == text.lower()
