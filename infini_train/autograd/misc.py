"""(filled in by the op-library work)"""
