"""validate_dataset / apply_policy on tiny synthetic datasets: one test per kind of bad input."""

import json
import shutil

import pytest
from dataset_testing import jpeg_without_eoi, make_dataset, truncate_file, write_image

from stagedyolo.dataset.validate import (
    DatasetError,
    apply_policy,
    img2label_path,
    validate_dataset,
    write_dataset_report,
)


@pytest.fixture
def ds(tmp_path):
    return make_dataset(tmp_path / "ds")


def bad_of(report):
    return [(b["file"].rsplit("/", 2)[-2:], b["line"], b["reason"]) for b in report["bad"]]


def set_label(ds, text, stem="train_000"):
    (ds.parent / "labels" / "train" / f"{stem}.txt").write_text(text)


def test_clean_dataset_counts_histogram_and_sizes(ds):
    r = validate_dataset(str(ds))
    assert r["bad"] == [] and r["totals"] == {"images": 8, "bad_images": 0, "bad_fraction": 0.0}
    train = r["splits"]["train"]
    assert (train["images"], train["labelled"], train["backgrounds"], train["boxes"]) == (6, 5, 1, 10)
    assert train["class_histogram"] == {"cat": 8, "dog": 2}
    assert train["image_size"]["min_w"] == train["image_size"]["max_h"] == 64


def test_corrupt_jpeg_without_eoi_is_flagged(ds):
    jpeg_without_eoi(ds.parent / "images" / "train" / "train_002.jpg")
    [(path, line, reason)] = bad_of(validate_dataset(str(ds)))
    assert path == ["train", "train_002.jpg"] and line is None and reason.startswith("corrupt JPEG (truncated)")


def test_truncated_image_is_flagged(ds):
    png = write_image(ds.parent / "images" / "train" / "extra.png", seed=7)
    truncate_file(png)
    [(path, _, reason)] = bad_of(validate_dataset(str(ds)))
    assert path == ["train", "extra.png"] and "truncated" in reason.lower()


def test_label_with_four_columns_names_file_and_line(ds):
    set_label(ds, "0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2\n")
    [(path, line, reason)] = bad_of(validate_dataset(str(ds)))
    assert path == ["train", "train_000.txt"] and line == 2 and "4 columns, expected 5" in reason


def test_non_numeric_field(ds):
    set_label(ds, "0 0.5 abc 0.2 0.2\n")
    [(_, line, reason)] = bad_of(validate_dataset(str(ds)))
    assert line == 1 and "non-numeric field 'abc'" in reason


def test_coordinates_above_one(ds):
    set_label(ds, "0 0.5 0.5 0.2 0.2\n\n0 32 16 8 8\n")
    [(_, line, reason)] = bad_of(validate_dataset(str(ds)))
    assert line == 3 and "not normalised" in reason and "divide pixel coordinates" in reason


def test_class_id_not_below_nc(ds):
    set_label(ds, "2 0.5 0.5 0.2 0.2\n")  # names has 2 classes: valid ids are 0 and 1
    [(_, line, reason)] = bad_of(validate_dataset(str(ds)))
    assert line == 1 and "class id 2" in reason and "nc=2" in reason


def test_two_images_sharing_a_broken_label_file_are_both_bad(ds):
    # yolov5 maps train_000.jpg and train_000.png to one label file: a broken line breaks both images
    write_image(ds.parent / "images" / "train" / "train_000.png", seed=5)
    set_label(ds, "0 0.5 abc 0.2 0.2\n")
    r = validate_dataset(str(ds))
    assert sorted(b["image"].rsplit("/", 1)[-1] for b in r["bad"]) == ["train_000.jpg", "train_000.png"]
    assert r["totals"]["bad_images"] == r["splits"]["train"]["bad_images"] == 2
    assert {p.rsplit("/", 1)[-1] for p in apply_policy(r, "skip", 0.5)} == {"train_000.jpg", "train_000.png"}


def test_duplicate_line_is_a_warning_not_bad(ds):
    set_label(ds, "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n")
    r = validate_dataset(str(ds))
    assert r["bad"] == [] and r["warnings"][0]["line"] == 2 and "duplicate of line 1" in r["warnings"][0]["reason"]


def test_empty_labels_dir_raises(ds):
    labels = ds.parent / "labels" / "val"
    shutil.rmtree(labels)
    labels.mkdir()
    with pytest.raises(DatasetError, match=r"no label files at all for split `val`.*labels/val"):
        validate_dataset(str(ds))


def test_missing_images_dir_raises(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    shutil.rmtree(tmp_path / "ds" / "images" / "val")  # labels/val is still there
    with pytest.raises(DatasetError) as e:
        validate_dataset(str(ds))
    assert "`val: images/val`" in str(e.value) and "images directory missing" in str(e.value)
    assert str(ds) in str(e.value)


def test_split_dir_without_images_raises(ds):
    for f in (ds.parent / "images" / "val").iterdir():
        f.unlink()
    with pytest.raises(DatasetError, match="no images found for `val:`"):
        validate_dataset(str(ds))


def test_wrong_path_in_data_yaml_raises(ds):
    ds.write_text(ds.read_text().replace("train: images/train", "train: imgs/train"))
    with pytest.raises(DatasetError) as e:
        validate_dataset(str(ds))
    msg = str(e.value)
    assert "`train: imgs/train`" in msg and str(ds.parent / "imgs" / "train") in msg and str(ds) in msg


def test_missing_and_unparseable_yaml(tmp_path):
    with pytest.raises(DatasetError, match="data.yaml not found"):
        validate_dataset(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: a\nval: [b\nnames: x\n")
    with pytest.raises(DatasetError, match=r"could not parse .*bad.yaml \(line"):
        validate_dataset(str(bad))


def test_path_key_list_of_dirs_and_txt_list(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    (tmp_path / "ds" / "val.txt").write_text("./images/val/val_000.jpg\n./images/val/val_001.jpg\n")
    other = tmp_path / "elsewhere"
    other.mkdir()
    ds.rename(other / "data.yaml")
    (other / "data.yaml").write_text(
        f"path: {tmp_path / 'ds'}\ntrain: [images/train, images/val]\nval: val.txt\nnames: [cat, dog]\n"
    )
    r = validate_dataset(str(other / "data.yaml"))
    assert r["splits"]["train"]["images"] == 8 and r["splits"]["val"]["images"] == 2
    assert r["totals"]["images"] == 8  # shared images are checked and counted once


def test_img2label_path_replaces_the_last_images_dir():
    assert img2label_path("/d/images/x/images/a.b.jpg") == "/d/images/x/labels/a.b.txt"
    assert img2label_path("/d/train/a.jpg") == "/d/train/a.txt"


def test_policy_skip_fail_and_fraction(ds):
    jpeg_without_eoi(ds.parent / "images" / "train" / "train_001.jpg")
    r = validate_dataset(str(ds))
    assert apply_policy(r, "skip", 0.2) == {str(ds.parent / "images" / "train" / "train_001.jpg")}
    with pytest.raises(DatasetError, match=r"(?s)on_bad_data is fail.*train_001.jpg"):
        apply_policy(r, "fail", 0.2)
    with pytest.raises(DatasetError, match=r"1 of 8 images \(12.5%\).*max_bad_fraction=0.1"):
        apply_policy(r, "skip", 0.1)


def test_report_files(ds, tmp_path):
    set_label(ds, "0 0.5 0.5 0.2\n")
    r = validate_dataset(str(ds))
    write_dataset_report(r, tmp_path / "out" / "r.json", tmp_path / "out" / "r.md")
    assert json.loads((tmp_path / "out" / "r.json").read_text())["totals"]["bad_images"] == 1
    md = (tmp_path / "out" / "r.md").read_text()
    assert "train_000.txt` line 1: 4 columns" in md and "| cat |" in md


def test_parallel_checks_match_serial(ds, monkeypatch):
    from stagedyolo.dataset import validate as v

    set_label(ds, "0 0.5 0.5 0.2\n")
    serial = validate_dataset(str(ds), workers=1)
    monkeypatch.setattr(v, "PARALLEL_THRESHOLD", 1)
    assert validate_dataset(str(ds), workers=2) == serial


def test_truncated_image_found_even_if_pil_was_relaxed_process_wide(ds, monkeypatch):
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    truncate_file(write_image(ds.parent / "images" / "train" / "extra.png", seed=7))
    assert [b["reason"] for b in validate_dataset(str(ds))["bad"]][0].startswith("truncated image")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # restored


def test_box_short_sides_are_measured_on_the_long_side_with_the_size_that_keeps_them_on_yolov5s_finest_grid(
    ds, tmp_path
):
    # A 128 x 64 image whose box is 6.4 px wide: 0.05 of the long side, as yolov5's letterbox scales it. The other
    # four labelled 64-px images hold a 0.25 and a 0.1 box each.
    write_image(ds.parent / "images" / "train" / "train_000.jpg", w=128, h=64)
    set_label(ds, "0 0.5 0.5 0.05 0.5\n")
    r = validate_dataset(str(ds))
    stats = r["splits"]["train"]["box_short_side"]
    # 95 % of the boxes reach 8 px from 8 / 0.05 = 160 px on (a multiple of 32, as yolov5 trains).
    assert stats == {"p5_of_long_side": 0.05, "median_of_long_side": 0.1, "min_img_for_95pct_at_stride": 160}
    write_dataset_report(r, tmp_path / "r.json", tmp_path / "r.md")
    assert "From **160 px** on, 95 % of them span at least 8 px" in (tmp_path / "r.md").read_text()
