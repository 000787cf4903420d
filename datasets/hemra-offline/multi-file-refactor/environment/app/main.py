from geometry import calc_area, total_area
from inventory import count_bigger_than, largest
from report import format_report

ITEMS = [
    ("door", {"kind": "rect", "w": 0.9, "h": 2.1}),
    ("table", {"kind": "circle", "r": 0.6}),
    ("sail", {"kind": "triangle", "base": 3.0, "h": 4.5}),
    ("window", {"kind": "rect", "w": 1.2, "h": 1.0}),
    ("coaster", {"kind": "circle", "r": 0.05}),
]


def main():
    for line in format_report(ITEMS):
        print(line)
    name, shape = largest(ITEMS)
    print(f"largest: {name} ({calc_area(shape):.2f})")
    print(f"bigger than 1.5: {count_bigger_than(ITEMS, 1.5)}")
    print(f"total: {total_area([shape for _, shape in ITEMS]):.2f}")


if __name__ == "__main__":
    main()
