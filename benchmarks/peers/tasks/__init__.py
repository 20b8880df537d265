"""Task modules the benchmark workers import (one per library, plus shared Redis helpers)."""
