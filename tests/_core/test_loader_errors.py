"""The two commonest newcomer mistakes get the fix in the message, from profile and autotune alike."""

import pytest
import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader, TensorDataset

import pipeline_opt as po
from pipeline_opt._core.loader_errors import PIL_HINT, loader_error_hint, with_loader_hint
from pipeline_opt.datasets import make_image_folder


@pytest.fixture(scope="module")
def pil_loader(tmp_path_factory):
    root = make_image_folder(n_images=8, size=(48, 48), num_classes=2, seed=1,
                             root=tmp_path_factory.mktemp("pil_jpegs"), workers=1)
    ds = torchvision.datasets.ImageFolder(str(root), transform=T.Resize((16, 16)))  # no ToTensor
    return DataLoader(ds, batch_size=4)


def _model():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))


def test_a_pil_dataset_without_to_tensor_is_told_to_add_it(pil_loader):
    with pytest.raises(TypeError) as profiled:
        po.profile(pil_loader, _model(), steps=2, warmup=0)
    assert "found <class 'PIL.Image.Image'>" in str(profiled.value) and "ToTensor()" in str(profiled.value)
    with pytest.raises(TypeError) as tuned:
        po.autotune(pil_loader, _model(), time_budget_s=10, progress=False)
    assert "the baseline trial" in str(tuned.value) and PIL_HINT in str(tuned.value)


@pytest.mark.filterwarnings("ignore:Got pickle error")
def test_a_lambda_collate_under_spawn_is_told_to_move_it_to_module_level():
    ds = TensorDataset(torch.zeros(8, 3, 4, 4), torch.zeros(8, dtype=torch.long))
    loader = DataLoader(ds, batch_size=2, num_workers=1, collate_fn=lambda b: b, multiprocessing_context="spawn")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 2))
    with pytest.raises(AttributeError) as err:
        po.profile(loader, model, steps=2, warmup=0)
    message = str(err.value)
    assert "Can't pickle local object" in message and "define it at module level" in message
    assert "multiprocessing_context='fork'" in message


@pytest.mark.parametrize("text", ["Can't pickle <function <lambda> at 0x7f>: attribute lookup <lambda> on __main__ "
                                  "failed", "Can't get local object 'build.<locals>.collate'"])
def test_the_other_pickle_messages_are_recognised(text):
    assert "module level" in loader_error_hint(RuntimeError(text))


def test_other_errors_are_left_as_they_are():
    assert loader_error_hint(ValueError("shape mismatch")) == "" and with_loader_hint(ValueError("x")) is None
