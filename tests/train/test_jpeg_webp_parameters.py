"""`dwb sample out.jpg` (or .webp) carries its parameters as AUTOMATIC1111 writes them, in EXIF UserComment: piexif's
own reader reads our text back, and PNG Info reads a JPEG that piexif wrote. A format that would carry none is
refused before any image is made."""
import piexif
import piexif.helper
import pytest
from PIL import Image

from models.checkpoints import content_hash, find_checkpoint
from models.generation import parse_parameters

PROMPT = "two blue squares"


@pytest.mark.parametrize("name", ["grid.jpg", "grid.jpeg", "grid.webp"])
def test_a_jpeg_or_webp_from_dwb_sample_carries_its_parameters_for_piexif(tiny_run, dwb, tmp_path, name):
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / name
    r = dwb("sample", str(ckpt), str(out), "--prompt", PROMPT, "--seeds", "1", "--seed", "7", "--steps", "2",
            "--guidance", "4")
    assert r.returncode == 0, r.stderr
    comment = piexif.load(str(out))["Exif"][piexif.ExifIFD.UserComment]
    text = piexif.helper.UserComment.load(comment)
    fields = parse_parameters(text)
    assert fields["prompt"] == PROMPT
    assert (fields["Steps"], fields["CFG scale"], fields["Seed"], fields["Size"]) == ("2", "4", "7", "16x16")
    assert fields["Model hash"] == content_hash(find_checkpoint(ckpt))
    from app.png_info import read_png_info

    assert read_png_info(out) == (text, None)  # PNG Info reads it back as it reads a PNG's text
    with Image.open(out) as image:
        assert image.format == {".webp": "WEBP"}.get(out.suffix, "JPEG")


def test_png_info_reads_the_parameters_of_a_jpeg_piexif_wrote(tmp_path):
    from app.png_info import read_png_info, settings_from

    text = "a red circle\nNegative prompt: blurry\nSteps: 12, Sampler: Euler a, CFG scale: 3, Seed: 42, Size: 32x32"
    exif = piexif.dump({"Exif": {piexif.ExifIFD.UserComment: piexif.helper.UserComment.dump(text, encoding="unicode")}})
    path = tmp_path / "a1111.jpg"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(path, format="JPEG", exif=exif)
    read, record = read_png_info(path)
    assert read == text and record is None
    values, _ = settings_from(read, lambda digest: None)
    assert (values["prompt"], values["negative_prompt"], values["steps"], values["sampler"], values["guidance"],
            values["seed"], values["width"]) == ("a red circle", "blurry", 12, "Euler a", 3.0, 42, 32)


def test_a_jpeg_without_parameters_is_said_in_one_line(tmp_path):
    from app.png_info import read_png_info
    from models.errors import WorkbenchError

    path = tmp_path / "plain.jpg"
    Image.new("RGB", (8, 8)).save(path, format="JPEG")
    with pytest.raises(WorkbenchError, match=r"^this JPEG carries no generation parameters \(no EXIF UserComment\)$"):
        read_png_info(path)


@pytest.mark.parametrize("name", ["grid.gif", "grid.bmp", "grid.tiff"])
def test_a_format_that_carries_no_parameters_is_refused_before_any_image_is_made(tiny_run, dwb, tmp_path, name):
    r = dwb("sample", str(tiny_run / "ep0-ba4-rank0.pt"), str(tmp_path / name), "--seeds", "1", "--steps", "1")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{name}: images are written as .png, .jpg or .webp, which carry their generation parameters" in r.stderr
    assert not list(tmp_path.iterdir())
