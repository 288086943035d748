"""What a family must provide: one entry in ``models/families/`` and one recipe in ``train/recipes/``. A new family
that leaves out a part of its entry, names a class diffusers does not have, or has no recipe fails here, by name,
before any command meets it."""
import diffusers
import pytest
import transformers

from models.export.family_export import KEY_MAPS
from models.families import FAMILIES, ORIGINAL_SD
from models.generation import FLOW_SAMPLERS, SAMPLERS, make_sampler
from train.recipes import RECIPES, LatentDiffusion, recipe_for


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_names_its_parts_and_how_they_are_found(family):
    assert hasattr(diffusers, family.pipeline) and family.folder_classes
    assert all(hasattr(diffusers, cls) for cls in family.folder_classes)
    assert family.single_file_marks and family.schedule in ("diffusion", "flow")
    for variant in family.variants:
        for name, part in variant.parts.items():
            library = {"diffusers": diffusers, "transformers": transformers}[part.library]
            assert hasattr(library, part.cls), f"{family.name} {variant.name}: no {part.library}.{part.cls} ({name})"
    base = family.variants[0].parts
    assert family.denoiser in base and "vae" in base and set(family.text_encoders) <= set(base)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_sampler_a_family_lists_is_made_from_the_sampler_its_pipeline_starts_with(family):
    """The assembly's scheduler is one diffusers builds, and each of the family's samplers is built from its config
    along the family's schedule (a flow family's along the flow)."""
    from models.checkpoints import family_scheduler

    settings = {key: {str: "epsilon", float: 3.0}[kind] for key, _, kind in family.assembly.settings}
    scheduler = family_scheduler(family, settings)
    allowed = FLOW_SAMPLERS if family.schedule == "flow" else SAMPLERS
    assert set(family.samplers) <= set(allowed)
    for name in family.samplers:
        made = make_sampler(name, scheduler.config)
        assert made.config.num_train_timesteps == 1000
        assert (family.schedule == "flow") == ("FlowMatch" in type(made).__name__ or made.config.get("use_flow_sigmas",
                                                                                                         False))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_says_how_it_exports_and_trains(family):
    """Its single file is a layout the export room writes (or SD's original one, which the door's own key maps
    write), and a recipe trains it: a ``LatentDiffusion`` whose pipeline the same entry assembles."""
    assert family.single_file is not None
    assert family.single_file.key_map == ORIGINAL_SD or family.single_file.key_map in KEY_MAPS
    if family.single_file.without_text is not None:
        assert family.single_file.without_text.key_map in KEY_MAPS
    assert set(family.single_file.in_file) <= set(family.variants[0].parts)
    recipe = recipe_for(family)
    assert issubclass(recipe.model, LatentDiffusion) and callable(recipe.build)
    assert recipe.model.family in recipe.families


def test_each_recipe_trains_a_family_there_is_and_no_family_has_two():
    names = [name for recipe in RECIPES for name in recipe.families]
    assert len(names) == len(set(names)) and set(names) == {f.name for f in FAMILIES}
