"""torch_xla's `torch_xla._dynamo.config`.

`skip_input_data_check`: torch_xla's bridge skips checking that inputs are device data. lazyxla's
trace-once backend syncs or splices pending inputs itself (Note [Trace once]), so the flag is
read by nothing; it exists so that programs setting it keep running.
"""

skip_input_data_check = False
