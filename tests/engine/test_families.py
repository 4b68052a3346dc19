"""The one definition of ``P.x`` families, read by the compiler and written by cubes and the matrix."""

from dsv4sel.engine.families import compact, family_of, is_family, members

CUDA = ("7.0", "7.5", "9.0", "10.0", "10.3", "11.0", "unknown")


def test_a_family_is_the_text_before_the_first_dot():
    assert (family_of("10.3"), family_of("gfx942"), family_of("unknown")) == ("10.x", None, None)
    assert is_family("10.x") and not is_family(".x") and not is_family("10.0")
    assert members("10.x", CUDA) == ["10.0", "10.3"] and members("12.x", CUDA) == []


def test_compact_writes_complete_families_where_they_stand():
    assert compact(["7.0", "7.5", "10.0", "unknown"], CUDA) == ["7.x", "10.0", "unknown"]
    # a lone member is its own name in cubes, a family in the matrix
    assert compact(["9.0", "10.0", "10.3"], CUDA) == ["9.0", "10.x"]
    assert compact(["9.0", "10.0", "10.3"], CUDA, min_members=1) == ["9.x", "10.x"]
