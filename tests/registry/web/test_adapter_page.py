import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.models import AdapterVersion, VersionStatus
from tests.factories import archive_upload, make_approved_version
from tests.support.adapters import AdapterSpec, tar_gz_bytes
from tests.support.pages import bulk_adapters, clone_versions, query_count

pytestmark = pytest.mark.django_db


def pickle_weights_archive() -> bytes:
    files = AdapterSpec().files()
    files["adapter_model.bin"] = files.pop("adapter_model.safetensors")
    return tar_gz_bytes(files)


def stored_files(tmp_path):
    root = tmp_path / "artifacts"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_it_shows_the_adapter_and_its_versions(web_lena, contracts, v1):
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    assert "Contract clause review." in page
    assert "<code>contracts</code>" in page  # served name
    assert "lena" in page  # owner and registrant
    assert f'href="/versions/{v1.pk}/"><strong>v1</strong>' in page
    assert 'class="badge badge-registered">Registered' in page
    assert "<time datetime=" in page
    assert "not served" in page


def test_outsiders_get_404(web_fred, contracts):
    response = web_fred.get(f"/adapters/{contracts.pk}/")
    assert response.status_code == 404
    assert b"Not found" in response.content
    assert b"contracts" not in response.content


def test_an_upload_registers_a_version_and_opens_it(web_lena, contracts):
    response = web_lena.post(
        f"/adapters/{contracts.pk}/versions/", {"files": archive_upload(AdapterSpec(seed=5))}
    )
    version = AdapterVersion.objects.get(adapter=contracts)
    assert response.status_code == 302
    assert response["Location"] == f"/versions/{version.pk}/"
    assert b"Registered version 1." in web_lena.get(response["Location"]).content


def test_an_htmx_upload_is_answered_with_a_client_redirect(web_lena, contracts):
    response = web_lena.post(
        f"/adapters/{contracts.pk}/versions/",
        {"files": archive_upload(AdapterSpec(seed=6))},
        headers={"HX-Request": "true"},
    )
    version = AdapterVersion.objects.get(adapter=contracts)
    assert response.status_code == 204
    assert response["HX-Redirect"] == f"/versions/{version.pk}/"


def test_a_bad_upload_shows_the_validators_message_next_to_the_form(web_lena, contracts, tmp_path):
    pickle = SimpleUploadedFile(
        "adapter.tar.gz",
        pickle_weights_archive(),
        content_type="application/gzip",
    )
    response = web_lena.post(f"/adapters/{contracts.pk}/versions/", {"files": pickle})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="upload-error"' in page
    assert "convert" in page.lower()
    assert not AdapterVersion.objects.exists()
    assert stored_files(tmp_path) == []


def test_a_bad_htmx_upload_swaps_in_the_form_with_the_message(web_lena, contracts):
    bad = SimpleUploadedFile("adapter_config.json", b"{not json", content_type="application/json")
    response = web_lena.post(
        f"/adapters/{contracts.pk}/versions/", {"files": bad}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="upload-form"')
    assert "Upload refused." in page
    assert "<html" not in page


def test_a_duplicate_upload_names_the_version_it_duplicates(web_lena, lena, contracts):
    spec = AdapterSpec(seed=7)
    web_lena.post(f"/adapters/{contracts.pk}/versions/", {"files": archive_upload(spec)})
    response = web_lena.post(f"/adapters/{contracts.pk}/versions/", {"files": archive_upload(spec)})
    assert response.status_code == 409
    assert b"identical to version 1" in response.content


def test_an_empty_upload_form_says_what_is_missing(web_lena, contracts):
    response = web_lena.post(f"/adapters/{contracts.pk}/versions/", {})
    assert response.status_code == 400
    assert b"Choose an archive" in response.content


def test_outsiders_cannot_upload(web_fred, contracts):
    response = web_fred.post(
        f"/adapters/{contracts.pk}/versions/", {"files": archive_upload(AdapterSpec(seed=8))}
    )
    assert response.status_code == 404
    assert not AdapterVersion.objects.exists()


def test_uploads_are_posts(web_lena, contracts):
    assert web_lena.get(f"/adapters/{contracts.pk}/versions/").status_code == 405


def test_versions_paginate(web_lena, contracts, v1):
    clone_versions(v1, contracts, 44, VersionStatus.REGISTERED)
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    assert "Page 1 of 3" in page
    assert "<strong>v45</strong>" in page
    assert "<strong>v1</strong>" not in page


def test_its_query_count_does_not_grow_with_the_data(web_lena, lena, alex, legal, contracts, v1):
    url = f"/adapters/{contracts.pk}/"
    small = query_count(web_lena, url)

    approved = make_approved_version(lena, alex, contracts, AdapterSpec(seed=9))
    clone_versions(approved, contracts, 120, VersionStatus.APPROVED, user=alex)
    bulk_adapters(legal, lena, 200)

    large = query_count(web_lena, url)
    assert large == small
    # 12, two for what it serves where beside its newest approved version, and
    # two for who may call it at the front doors (its deployments, its grants).
    assert large <= 16
