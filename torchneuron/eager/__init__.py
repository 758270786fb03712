"""The eager driver: runs the lowering table op by op, with exact storage/view semantics."""
