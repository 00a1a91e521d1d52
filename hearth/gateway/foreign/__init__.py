"""foreign"""
