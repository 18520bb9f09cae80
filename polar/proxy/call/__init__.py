"""One model call: intake (the session, once; the body decoded), the plan (parent, prompt ids, admission),
generation (complete or streamed) and one recorder of its outcome."""
