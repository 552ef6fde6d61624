"""Synthetic datasets in the on-disk formats of mmdet3d's KITTI and nuScenes datasets.

:mod:`.scene` samples one LiDAR scene (shared by every writer); :mod:`.kitti` writes
KITTI-format data; :mod:`.nuscenes` writes nuScenes-format data (temporal scenes, six
cameras, database tables; sensors in :mod:`.nuscenes_sensors`). :mod:`.exact` holds the
float64 math that gives the same bits on every CPU, :mod:`.fingerprint` hashes a
generated set's content. ``tools/create_synthetic_data.py`` is the command line.
"""
from .scene import (KITTI_CLASSES, Area, Scene, SensorModel, SizePrior,
                    box_corners_lidar, points_in_box_mask, sample_scene)

__all__ = ['KITTI_CLASSES', 'Area', 'Scene', 'SensorModel', 'SizePrior',
           'box_corners_lidar', 'points_in_box_mask', 'sample_scene']
