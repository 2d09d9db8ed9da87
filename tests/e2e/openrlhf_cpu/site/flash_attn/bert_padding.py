index_first_axis = pad_input = rearrange = unpad_input = None
