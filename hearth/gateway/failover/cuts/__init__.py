"""cuts"""
