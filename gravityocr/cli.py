import sys
def main(argv=None):
    print("gravityocr: not yet")
    return 0
