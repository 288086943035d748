"""The ground floor every room of models stands on, and train and the command packages with them.

- ``diffusers_patches``: diffusers 0.39.0's Flux.1 single-file converter at any width, for the checkpoint door
  (training's library patches are ``train.patches``, the app's Gradio ones ``app.gradio_patches``);
- ``files``: files written whole or not at all, and a full disk said in one line;
- ``outside_json``: JSON a checkpoint, dataset, rater or other process wrote, bounded in size and nesting;
- ``typed_config``: YAML and ``key=value`` read into dataclasses: types, value ranges, unknown keys;
- ``serving``: the servers' deadline for a request to arrive and their cap on open connections;
- ``s3``: an S3 URL's bucket and key, a client that names what it lacks, and the cache of downloads;
- ``digits``: intervals and p-values printed so that rounding never contradicts the verdict beside them, and the
  prompts or votes that would flip a verdict, in the same words on every surface;
- ``escaping``: text from outside escaped for a spreadsheet cell;
- ``arguments``: the command line's argparse types: numbers in a range, values a one-line parser reads;
- ``ranks``: the processes of a launch on ``torch.distributed``: rank, world size, the group, every collective;
- ``faces``: how a room's face hands on its names (this face too).
"""
from .faces import face

__getattr__, __all__ = face(__name__, {
    "diffusers_patches": "flux_single_file_widths",
    "digits": "flip_text interval_decimals interval_text outward p_value_text round_up",
    "escaping": "FORMULA_STARTS spreadsheet_cell",
    "arguments": "between from_parser number_from number_text part_of positive positive_number share size_list "
                 "switch_fraction",
    "faces": "face",
    "ranks": "PATIENT_S all_reduce barrier broadcast_object collective_device gather_objects global_rank join_group "
             "local_rank world_size",
    "outside_json": "MAX_DEPTH load_outside loads_outside nesting_depth",
    "files": "disk_full_error is_disk_full sha256_of torch_save_whole whole_file whole_folder write_bytes_whole "
             "write_text_whole",
    "s3": "download_cache s3_client split_s3",
    "serving": "DeadlineProtocol allow_open_files deadline_protocol",
    "typed_config": "AT_LEAST_ONE MAX_TIME NON_NEGATIVE POSITIVE PROBABILITY RULE SEED Duration Each OneOf Range build_config "
                    "check_rules checked merge_config one_of parse_overrides read_config_file shown",
})
