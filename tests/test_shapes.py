import pytest

from harness.providers import shapes


def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_op_key_wins_over_family_key(tmp_path):
    p = write(tmp_path, "mm: {shapes: [[1, 2, 3]]}\nblas: {shapes: [[4, 5, 6]]}\n")
    assert shapes.resolve(p, "mm", ("blas",)) == ("mm", [[1, 2, 3]], None)


def test_family_key_fallback_and_dtypes(tmp_path):
    p = write(tmp_path, "blas:\n  shapes: [[4, 5, 6]]\n  dtypes: [bf16]\n")
    assert shapes.resolve(p, "mm", ("blas",), ndim=3) == ("blas", [[4, 5, 6]], ["bf16"])


def test_bare_list_and_scalar_shapes(tmp_path):
    p = write(tmp_path, "add: [[2, 3], 7]\n")
    assert shapes.resolve(p, "add", ())[1] == [[2, 3], [7]]


@pytest.mark.parametrize("text,match", [
    ("other: {shapes: [[1]]}\n", r"no entry for 'mm' \(keys tried: mm, blas\)"),
    ("mm: {shapes: [[1, 0, 3]]}\n", r"key 'mm': shapes\[0\] = \[1, 0, 3\] is not a list of positive ints"),
    ("mm: {shapes: [[1, 2]]}\n", r"key 'mm': shapes\[0\] = \[1, 2\] has 2 dims, 'mm' takes 3"),
    ("mm: {shapes: []}\n", r"key 'mm': 'shapes' must be a non-empty list"),
    ("mm: {shapes: [[1, 2, 3]], dtypes: [int8]}\n", r"key 'mm': dtypes \['int8'\]"),
    ("mm: {shape: [[1, 2, 3]]}\n", r"key 'mm': expected a mapping with a 'shapes' list"),
    ("mm: {shapes: [[1, 2, 3]], level: core}\n", r"key 'mm': unknown fields \['level'\]"),
    ("- 1\n- 2\n", r"top level must be a mapping"),
    ("mm: [\n", r"not valid yaml"),
])
def test_errors_name_file_and_key(tmp_path, text, match):
    p = write(tmp_path, text)
    with pytest.raises(shapes.ShapeFileError, match=match) as info:
        shapes.resolve(p, "mm", ("blas",), ndim=3)
    assert str(p) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(shapes.ShapeFileError, match="does not exist"):
        shapes.resolve(tmp_path / "nope.yaml", "mm", ())


def test_written_shapes_read_back(tmp_path):
    out = tmp_path / "shapes.yaml"
    shapes.write_used(out, "softmax", [[4, 16], [3, 40]], ["fp32"], "src.yaml#norm")
    assert shapes.resolve(out, "softmax", ()) == ("softmax", [[4, 16], [3, 40]], ["fp32"])


def test_builtin_shape_files_cover_every_builtin_op():
    from harness.providers import registry

    for name in registry.builtin_names():
        op, _ = registry.load(name)
        for f in ("default.yaml", "tiny.yaml"):
            key, found, _ = shapes.resolve(registry.BUILTIN_DIR.parent / "shapes" / f, op.name, op.shape_keys,
                                           len(op.dims) if op.dims else None)
            assert found, (name, f)


def test_file_errors_say_it_is_a_shape_file(tmp_path):
    with pytest.raises(shapes.ShapeFileError) as info:
        shapes.resolve(tmp_path / "nope.yaml", "mm", ())
    assert str(info.value) == f"shape file {tmp_path / 'nope.yaml'} does not exist"
    p = write(tmp_path, "- [1]\n")
    with pytest.raises(shapes.ShapeFileError) as info:
        shapes.load(p)
    assert str(info.value) == f"shape file {p}: top level must be a mapping of op or family names"


def test_first_family_key_present_wins(tmp_path):
    p = write(tmp_path, "reduce: [[1]]\nnorm: [[2]]\n")
    assert shapes.resolve(p, "softmax", ("missing", "norm", "reduce"))[:2] == ("norm", [[2]])


@pytest.mark.parametrize("bad", ["[[1, true]]", "[[]]", "['4x16']", "[[2.5]]", "[-3]", "[0]", "[{a: 1}]"])
def test_every_dim_must_be_a_positive_int(tmp_path, bad):
    p = write(tmp_path, f"mm: {{shapes: {bad}}}\n")
    with pytest.raises(shapes.ShapeFileError, match=r"shapes\[0\] = .* is not a list of positive ints$"):
        shapes.resolve(p, "mm", ())


@pytest.mark.parametrize("bad", ["[1000000000000, 1000000]", "[100000000000000000000]", "[2147483648, 1]",
                                 "[65536, 65536, 65537]"])
def test_a_shape_past_the_ceilings_is_refused_before_any_input_is_made(tmp_path, bad):
    p = write(tmp_path, f"softmax: {{shapes: [[4, 4], {bad}]}}\n")
    with pytest.raises(shapes.ShapeFileError, match=r"shapes\[1\] = .* is past the ceilings of a shape \(each dim at "
                                                     r"most 2\*\*31-1, their product at most 2\*\*48\)$"):
        shapes.resolve(p, "softmax", ())


def test_the_largest_shapes_within_the_ceilings_are_taken(tmp_path):
    p = write(tmp_path, "mm: [[65536, 65536, 65536], [2147483647, 1]]\n")
    assert shapes.resolve(p, "mm", ())[1] == [[65536, 65536, 65536], [2147483647, 1]]


def test_the_index_of_the_bad_shape_is_named(tmp_path):
    p = write(tmp_path, "mm: [[1, 2], [3, 0]]\n")
    with pytest.raises(shapes.ShapeFileError, match=r"shapes\[1\] = \[3, 0\]"):
        shapes.resolve(p, "mm", ())


@pytest.mark.parametrize("entry,match", [
    ("{shapes: [1]}", None), ("{shapes: 7}", "'shapes' must be a non-empty list"),
    ("{shapes: [1], dtypes: bf16}", r"dtypes 'bf16' must be a non-empty list of distinct names drawn from fp16"),
    ("{shapes: [1], dtypes: []}", r"dtypes \[\] must be a non-empty list"),
    ("{shapes: [1], dtypes: [fp16, fp16]}", r"dtypes \['fp16', 'fp16'\] must be a non-empty list of distinct"),
    ("{shapes: [[4, 16], [8], [4, 16]]}", r"shapes\[2\] = \[4, 16\] repeats shapes\[0\]"),
    ("{shapes: [8, [8]]}", r"shapes\[1\] = \[8\] repeats shapes\[0\]"),
    ("7", "expected a mapping with a 'shapes' list"),
])
def test_entry_forms(tmp_path, entry, match):
    p = write(tmp_path, f"add: {entry}\n")
    if match is None:
        assert shapes.resolve(p, "add", ()) == ("add", [[1]], None)
    else:
        with pytest.raises(shapes.ShapeFileError, match=match):
            shapes.resolve(p, "add", ())


def test_any_number_of_dims_without_ndim(tmp_path):
    p = write(tmp_path, "add: [[1], [1, 2, 3, 4]]\n")
    assert shapes.resolve(p, "add", ())[1] == [[1], [1, 2, 3, 4]]
    assert shapes.resolve(p, "add", (), ndim=None)[1] == [[1], [1, 2, 3, 4]]


def test_written_shapes_file_is_short_and_says_where_it_came_from(tmp_path):
    out = tmp_path / "shapes.yaml"
    shapes.write_used(out, "mm", [[4, 16, 8]], ["fp16", "bf16"], "shapes/tiny.yaml#blas")
    assert out.read_text() == ("# shapes used by this run (from shapes/tiny.yaml#blas)\n"
                               "mm:\n  shapes:\n  - [4, 16, 8]\n  dtypes: [fp16, bf16]\n")


def test_label_joins_dims_with_x():
    assert shapes.label([4, 16, 8]) == "4x16x8"
    assert shapes.label((7,)) == "7"
